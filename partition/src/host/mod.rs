//! What `reserve` takes from the host once and what records who owns it: the host plan,
//! the reservation (hugepages, pool file, isolated cores), the ledger, a launcher's claim
//! and the keeper that holds it for a sandboxed launcher, `status`/`release` seen from
//! outside, and the pod variant where the kubelet owns the host.

pub mod claim;
pub mod coreclaims;
pub mod giveback;
pub mod irqbalance;
pub mod isolation;
pub mod keeper;
pub mod ledger;
pub mod partitions;
pub mod plan;
pub mod pod;
pub mod reserve;
pub mod tuning;
pub mod volume;
