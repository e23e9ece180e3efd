//! The code of the idem examples that is larger than one file:
//! [`grpc_payments`], the service of the `grpc_payments` example, with its
//! `.proto` and the code generated from it; [`psp`], the `psp_payment`
//! example's provider and shop. The examples themselves, one
//! concept each, are cargo examples of this crate: `examples/README.md`
//! lists them. The reference app is the `idem-app` crate.

pub mod grpc_payments;
pub mod psp;
