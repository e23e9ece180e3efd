//! Each seeded bug is caught: the checker finds a counterexample to the
//! property the bug breaks, and the shortest path to it is printed (run with
//! `--nocapture` to read it) and kept in the assertion message.

use idem_verify::{Bug, IdemModel, Mode, Trace, hunt};

/// The shortest counterexample `bug` has in `mode` to the property it
/// breaks.
fn caught(mode: Mode, bug: Bug) -> Trace {
    caught_in(IdemModel::new(mode), bug)
}

/// The shortest counterexample `bug` has in `model` to the property it
/// breaks.
fn caught_in(model: IdemModel, bug: Bug) -> Trace {
    let mode = model.mode;
    let property = bug.breaks().expect("a seeded bug breaks a property");
    let verdict = hunt(model.with_bug(bug), property);
    let Some(trace) = verdict.counterexamples.get(property) else {
        panic!("{bug:?} in {mode:?} mode: no counterexample to \"{property}\"; {verdict}");
    };
    assert!(
        !trace.is_empty(),
        "{bug:?} in {mode:?} mode: \"{property}\" fails in the initial state"
    );
    eprintln!(
        "{bug:?} in {mode:?} mode breaks \"{property}\" in {} steps ({} states):\n{trace}",
        trace.len(),
        verdict.unique_states
    );
    trace.clone()
}

/// Every seeded bug has a test below.
#[test]
fn every_seeded_bug_breaks_a_property() {
    for bug in Bug::SEEDED {
        assert!(bug.breaks().is_some(), "{bug:?}");
    }
    assert_eq!(Bug::None.breaks(), None);
}

/// The gate's completion, unfenced, completes the in-flight record of
/// another request that claimed the key after Redis lost it: that request's
/// retry is replayed a response of another fingerprint.
#[test]
fn completing_without_the_owner_check_replays_another_requests_response() {
    caught(Mode::Plain, Bug::CompleteWithoutOwnerCheck);
    caught(Mode::Transactional, Bug::CompleteWithoutOwnerCheck);
}

/// A duplicate takes the key of a live first attempt, and both run the
/// effect. (Plain mode: a transactional claim has no lease to ignore.)
#[test]
fn a_takeover_that_ignores_the_lease_runs_the_effect_twice() {
    caught(Mode::Plain, Bug::TakeoverIgnoresLease);
}

/// A crashed first attempt's transaction is gone, but the gate's "in
/// flight" turns its retry away for the gate record's whole lease.
/// (Transactional mode: plain claims trust the gate's "in flight" by
/// design, their claims living by the same lease.)
#[test]
fn trusting_the_gate_on_a_transactional_claim_keeps_a_dead_owners_key() {
    caught(Mode::Transactional, Bug::GateTrustedWithoutSqlOnTxClaim);
}

/// The release after the commit deletes the completed record, and a retry
/// runs the effect again.
#[test]
fn a_release_after_the_commit_runs_the_effect_twice() {
    caught(Mode::Plain, Bug::ReleaseAfterCommit);
    caught(Mode::Transactional, Bug::ReleaseAfterCommit);
}

/// The gate's 422, trusted, refuses the retry of a request SQL committed,
/// once another body claimed the gate after the first's gate record was
/// gone. The real tiered store did this until the model found it.
#[test]
fn trusting_the_gates_mismatch_refuses_a_committed_request() {
    caught(Mode::Plain, Bug::GateTrustsMismatch);
    caught(Mode::Transactional, Bug::GateTrustsMismatch);
}

/// A key made per run for the handler's call out: a run after a crash
/// between the call and the commit (transactional), or after a plain claim
/// abandoned past its effect, calls the provider under a key it has not
/// seen, and the card is charged twice. With the derived key the provider
/// replays its charge, in both modes.
#[test]
fn a_call_out_keyed_per_run_charges_twice() {
    caught(Mode::Plain, Bug::ChildKeyPerRun);
    caught(Mode::Transactional, Bug::ChildKeyPerRun);
}

/// A phase's point recorded after its writes commit, in a transaction of
/// its own: a run cut between the two leaves the order without its point,
/// and the retry creates it again. With the point in the phase's
/// transaction the retry finds it and resumes, in both modes.
#[test]
fn a_point_recorded_after_its_phase_commits_makes_the_order_twice() {
    caught_in(
        IdemModel::new(Mode::Plain).with_phases(),
        Bug::PointAfterPhaseCommit,
    );
    caught_in(
        IdemModel::new(Mode::Transactional).with_phases(),
        Bug::PointAfterPhaseCommit,
    );
}

/// A handler's nested transaction that commits the claim's transaction:
/// the effect is kept while the key is free again, and a second instance
/// (or the retry of a handler that then failed) runs it once more. As a
/// savepoint of the claim's transaction, it commits with the record.
#[test]
fn a_nested_commit_that_ends_the_claims_transaction_runs_the_effect_twice() {
    caught(Mode::Transactional, Bug::HandlerEndsTransaction);
}
