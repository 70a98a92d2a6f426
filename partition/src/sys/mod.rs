//! The OS seams: reading user-named files bounded and without following hostile links,
//! the state directory opened safely, the stop signals as events, the sandbox that confines
//! a running VMM, and the launch timeline's process-wide clock marks, and the client of a running VMM's API.

pub mod api_client;
pub mod files;
pub mod sandbox;
pub mod seccomp;
pub mod signals;
pub mod statedir;
pub mod timeline;
