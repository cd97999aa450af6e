//! Tests of the deployment files under `deploy/` (docker-compose, Kubernetes manifests): they
//! parse, every embedded agentkv config is a valid `FileConfig`, and the pieces agree with each
//! other (router worker URLs and KV-event sources name the replicas and the ports their config
//! binds, selectors match pod labels, ports and mounts line up). Test-only; never deploys.

use std::path::PathBuf;

use serde_norway::Value;

use crate::config::FileConfig;

fn deploy_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../deploy")
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(deploy_dir().join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// Every document of a YAML file, merge keys (`<<:`) applied.
fn documents(rel: &str) -> Vec<Value> {
    let text = read(rel);
    serde_norway::Deserializer::from_str(&text)
        .map(|d| {
            let mut v: Value =
                serde::Deserialize::deserialize(d).unwrap_or_else(|e| panic!("{rel}: {e}"));
            v.apply_merge().unwrap();
            v
        })
        .collect()
}

fn s(v: &Value) -> &str {
    v.as_str().unwrap_or_else(|| panic!("not a string: {v:?}"))
}

/// The replica config and the port of its KV-event endpoint.
fn replica_config(text: &str) -> (FileConfig, u16) {
    let cfg = FileConfig::parse(text).expect("a valid agentkv config");
    let ep = cfg
        .kv_events
        .endpoint
        .clone()
        .expect("replicas publish KV events");
    let port = ep.rsplit(':').next().unwrap().parse().unwrap();
    assert!(cfg.kv_events.replay_endpoint.is_some());
    assert!(
        cfg.tiers
            .iter()
            .any(|t| matches!(t, tier::TierConfig::Redis { .. })),
        "replicas share a Redis tier"
    );
    (cfg, port)
}

#[test]
fn docker_compose_runs_replicas_behind_a_kv_aware_router_with_redis() {
    let (cfg, events_port) = replica_config(&read("agentkv-replica.yaml"));
    let http_port = cfg.server.port.unwrap();
    let docs = documents("docker-compose.yml");
    let services = docs[0]["services"].as_mapping().unwrap();
    assert!(services.contains_key("redis"));
    let replicas: Vec<&str> = services
        .keys()
        .map(s)
        .filter(|n| n.starts_with("agentkv-"))
        .collect();
    assert!(replicas.len() >= 2, "{replicas:?}");
    for name in &replicas {
        let svc = &services[*name];
        let args: Vec<&str> = svc["command"]
            .as_sequence()
            .unwrap()
            .iter()
            .map(s)
            .collect();
        assert_eq!(
            args[..3],
            ["serve", "--config", "/etc/agentkv/agentkv.yaml"]
        );
        let mounts: Vec<&str> = svc["volumes"]
            .as_sequence()
            .unwrap()
            .iter()
            .map(s)
            .collect();
        assert!(mounts.contains(&"./agentkv-replica.yaml:/etc/agentkv/agentkv.yaml:ro"));
    }
    let router = s(&services["router"]["command"][2]);
    assert!(router.contains("vllm-router==0.1.17"), "{router}");
    assert!(router.contains("--policy kv_aware"));
    for name in &replicas {
        let url = format!("http://{name}:{http_port}");
        assert!(router.contains(&url), "{url} missing from the worker URLs");
        assert!(
            router.contains(&format!(
                "--kv-event-source {url}=tcp://{name}:{events_port}"
            )),
            "no event source for {name}"
        );
    }
    assert!(deploy_dir().join("Dockerfile").exists());
}

#[test]
fn kubernetes_manifests_agree_with_each_other_and_the_replica_config() {
    let mut by_kind: std::collections::BTreeMap<String, Vec<Value>> = Default::default();
    for file in [
        "k8s/configmap.yaml",
        "k8s/deployment.yaml",
        "k8s/service.yaml",
        "k8s/inferencepool.yaml",
        "k8s/redis.yaml",
    ] {
        for doc in documents(file) {
            assert!(doc["apiVersion"].is_string(), "{file}: no apiVersion");
            by_kind
                .entry(s(&doc["kind"]).to_string())
                .or_default()
                .push(doc);
        }
    }
    let cm = &by_kind["ConfigMap"][0];
    let embedded = s(&cm["data"]["agentkv.yaml"]);
    let (_, events_port) = replica_config(embedded);
    let a: Value = serde_norway::from_str(embedded).unwrap();
    let b: Value = serde_norway::from_str(&read("agentkv-replica.yaml")).unwrap();
    assert_eq!(a, b, "the ConfigMap carries deploy/agentkv-replica.yaml");

    let dep = by_kind["Deployment"]
        .iter()
        .find(|d| d["metadata"]["name"] == "agentkv")
        .unwrap();
    let labels = &dep["spec"]["template"]["metadata"]["labels"];
    assert_eq!(&dep["spec"]["selector"]["matchLabels"], labels);
    let c = &dep["spec"]["template"]["spec"]["containers"][0];
    let ports: Vec<u64> = c["ports"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|p| p["containerPort"].as_u64().unwrap())
        .collect();
    assert!(ports.contains(&8000) && ports.contains(&u64::from(events_port)));
    let args: Vec<&str> = c["args"].as_sequence().unwrap().iter().map(s).collect();
    assert_eq!(
        args[..3],
        ["serve", "--config", "/etc/agentkv/agentkv.yaml"]
    );
    assert!(c["volumeMounts"]
        .as_sequence()
        .unwrap()
        .iter()
        .any(|m| m["mountPath"] == "/etc/agentkv" && m["name"] == "config"));

    let svc = by_kind["Service"]
        .iter()
        .find(|d| d["metadata"]["name"] == "agentkv")
        .unwrap();
    for (k, v) in svc["spec"]["selector"].as_mapping().unwrap() {
        assert_eq!(
            labels.as_mapping().unwrap().get(k),
            Some(v),
            "the Service selects the pods"
        );
    }
    let pool = &by_kind["InferencePool"][0];
    assert_eq!(&pool["spec"]["selector"]["matchLabels"], labels);
    assert_eq!(
        pool["spec"]["targetPorts"][0]["number"].as_u64(),
        Some(8000)
    );
    assert!(pool["spec"]["endpointPickerRef"]["name"].is_string());
    let redis_svc = by_kind["Service"]
        .iter()
        .find(|d| d["metadata"]["name"] == "redis");
    assert!(
        redis_svc.is_some(),
        "the config's redis://redis:6379 exists"
    );
}
