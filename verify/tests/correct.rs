//! The protocol as implemented keeps every property, in both modes, under
//! every fault the model has, and reaches every path worth checking.

use idem_verify::{ClientSpec, Faults, IdemModel, Mode, check};

/// Every fault at once, one of each.
const EVERY_FAULT: Faults = Faults {
    crashes: 1,
    redis_losses: 1,
    redis_errors: 1,
    handler_failures: 1,
    stalls: 1,
};

fn keeps_every_property(model: IdemModel) {
    let name = format!("{:?} mode, {:?}", model.mode, model.faults);
    let verdict = check(model);
    assert!(verdict.passed(), "{name}: {verdict}");
    eprintln!("{name}: {verdict}");
}

#[test]
fn plain_claims_keep_every_property() {
    keeps_every_property(IdemModel::new(Mode::Plain));
}

#[test]
fn transactional_claims_keep_every_property() {
    keeps_every_property(IdemModel::new(Mode::Transactional));
}

#[test]
fn plain_claims_keep_every_property_under_every_fault() {
    keeps_every_property(IdemModel::new(Mode::Plain).with_faults(EVERY_FAULT));
}

#[test]
fn transactional_claims_keep_every_property_under_every_fault() {
    keeps_every_property(IdemModel::new(Mode::Transactional).with_faults(EVERY_FAULT));
}

/// Two keys, one request each with the same fingerprint: no answer, effect
/// or record of one reaches the other.
#[test]
fn keys_stay_apart() {
    let clients = vec![
        ClientSpec {
            key: 0,
            fingerprint: 0,
            tries: 2,
        },
        ClientSpec {
            key: 1,
            fingerprint: 0,
            tries: 2,
        },
    ];
    let faults = Faults {
        crashes: 1,
        redis_losses: 1,
        ..Faults::default()
    };
    for mode in [Mode::Plain, Mode::Transactional] {
        keeps_every_property(
            IdemModel::new(mode)
                .with_clients(2, clients.clone())
                .with_faults(faults),
        );
    }
}

/// A phased handler: the order's writes once per request, one charge, and
/// every other property, through crashes and failures between phases; and
/// runs do resume.
#[test]
fn phased_handlers_keep_every_property() {
    for mode in [Mode::Plain, Mode::Transactional] {
        keeps_every_property(IdemModel::new(mode).with_phases());
    }
}
