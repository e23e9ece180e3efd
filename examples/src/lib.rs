//! Runnable idem apps. [`orders`] is the reference app of DESIGN section 7:
//! run it with `cargo run -p idem-examples --bin orders`.

pub mod orders;
