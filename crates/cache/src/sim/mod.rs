//! Cache simulator (one server, or a routed fleet: `route.rs`) and agent-trace generators, built
//! on the same [`crate::KvCache`] the server uses. Pure functions over in-memory traces; the CLI does the file I/O.

mod gen;
mod mooncake;
mod optimum;
mod oracle;
mod rng;
mod route;
mod run;
mod trace;

pub use gen::{generate, TraceKind, TraceParams};
pub use mooncake::{
    mooncake_calls, mooncake_prompt, HashIdTooLarge, MooncakeRequest, MOONCAKE_BLOCK_TOKENS,
};
pub use optimum::{optimum, Optimum};
pub use oracle::label_conversations;
pub use route::{simulate_routing, RouteConfig, RoutePolicy, RouteReport};
pub use run::{simulate, InferredRetention, SessionRetention, SimConfig, SimError, SimReport};
pub use trace::TraceCall;
