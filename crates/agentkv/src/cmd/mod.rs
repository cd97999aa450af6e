//! One module per subcommand: argument structs and thin glue over the library crates.

pub mod bench_agent;
pub mod bench_args;
pub mod bench_constraint;
pub mod bench_engine;
pub mod bench_model;
pub mod bench_roofline;
pub mod cache_sim;
pub mod common;
pub mod device;
pub mod fetch_model;
pub mod generate;
pub mod gpu_check;
pub mod info;
pub mod kv_size;
pub mod logging;
pub mod mooncake_replay;
pub mod perplexity;
pub mod route_sim;
pub mod serve;
pub mod trace_gen;
