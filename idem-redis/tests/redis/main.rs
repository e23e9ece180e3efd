//! idem-redis against real Redis servers, one module per subject, in one
//! test binary: `store` the conformance suite on a single server and on a
//! Cluster, `sentinel` the store behind Sentinel through a failover,
//! `tiered` the Redis gate in front of a SQL store.

mod sentinel;
mod store;
mod tiered;
