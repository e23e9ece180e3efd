//! The `psp_payment` example's two services: a stand-in payment service
//! provider that deduplicates charges by `Idempotency-Key` as Stripe does
//! ([`provider`]), and a shop whose payment handler charges it and then
//! writes the order in transactional mode ([`shop`]), its call to the
//! provider keyed by `operation.key_for("psp-charge")` (docs/outbound.md);
//! and the same shop in phases, each recorded with its output, so that a
//! retry resumes after the last one ([`phased`]).

pub mod phased;
pub mod provider;
pub mod shop;
