//! `GET /v1/models`: the list of served models. Shape only.

use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelList {
    /// Always `"list"`.
    pub object: String,
    pub data: Vec<ModelCard>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelCard {
    pub id: String,
    /// Always `"model"`.
    pub object: String,
    /// Unix seconds.
    pub created: u64,
    pub owned_by: String,
    /// Context length in tokens (a vLLM extra).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_model_len: Option<u64>,
}
