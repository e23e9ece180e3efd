//! Running the checker on a model, and what it found: counterexamples as
//! readable traces, the `sometimes` properties left unreached, and the size
//! of the search.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::time::{Duration, Instant};

use stateright::{Checker, Expectation, HasDiscoveries, Model, Path};

use crate::config::IdemModel;
use crate::model::Action;
use crate::state::{State, Step};

/// What a run of the checker found.
#[derive(Debug)]
pub struct Verdict {
    /// Distinct states explored.
    pub unique_states: usize,
    /// The depth of the deepest state explored, the initial state's being 1.
    pub max_depth: usize,
    /// Whether the whole bounded state space was explored (a hunt for one
    /// counterexample stops at the first, and a check once every property
    /// has a discovery).
    pub exhaustive: bool,
    /// How long the run took.
    pub elapsed: Duration,
    /// The counterexamples to `always` properties, by property: one the
    /// breadth-first search met ([`check`]), or the shortest there is
    /// ([`hunt`], for the property hunted).
    pub counterexamples: BTreeMap<&'static str, Trace>,
    /// The `sometimes` properties no state reached, over an exhaustive run
    /// (empty otherwise: a run stopped early proves nothing unreachable).
    pub unreached: Vec<&'static str>,
}

impl Verdict {
    /// Whether every `always` property held and every `sometimes` property
    /// was reached, over the whole bounded state space.
    pub fn passed(&self) -> bool {
        self.exhaustive && self.counterexamples.is_empty() && self.unreached.is_empty()
    }
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{} states, depth {}, {:.1?}{}",
            self.unique_states,
            self.max_depth,
            self.elapsed,
            if self.exhaustive {
                ""
            } else {
                " (stopped early)"
            }
        )?;
        for (property, trace) in &self.counterexamples {
            writeln!(
                f,
                "counterexample to \"{property}\" ({} steps):\n{trace}",
                trace.len()
            )?;
        }
        for property in &self.unreached {
            writeln!(f, "never reached: \"{property}\"")?;
        }
        Ok(())
    }
}

/// A path through the model, one line per action with what it did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Trace(Vec<String>);

impl Trace {
    fn new(model: &IdemModel, path: Path<State, Action>) -> Self {
        let mut lines = Vec::new();
        let mut steps = path.into_vec().into_iter().peekable();
        while let Some((before, action)) = steps.next() {
            let (Some(action), Some((after, _))) = (action, steps.peek()) else {
                continue;
            };
            lines.push(describe(model, &before, action, after));
        }
        Self(lines)
    }

    /// The number of actions.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether the trace has no action (a property false in the initial
    /// state).
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl fmt::Display for Trace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (n, line) in self.0.iter().enumerate() {
            writeln!(f, "{:>3}. {line}", n + 1)?;
        }
        Ok(())
    }
}

/// Explores the whole bounded state space of `model`, breadth-first.
pub fn check(model: IdemModel) -> Verdict {
    run(model, HasDiscoveries::All, None)
}

/// Explores `model` breadth-first until it meets a counterexample to
/// `property`, then shortens it: the search runs again within one step less
/// than the counterexample it has, until it finds none. (The checker keeps
/// the last discovery of a batch of states, not the first, so the first run
/// may report a path a step longer than the shortest.) The verdict counts the
/// states of the first run.
pub fn hunt(model: IdemModel, property: &'static str) -> Verdict {
    assert!(
        model.properties().iter().any(|p| p.name == property),
        "no property \"{property}\""
    );
    let wanted = || HasDiscoveries::AnyOf(BTreeSet::from([property]));
    let mut verdict = run(model.clone(), wanted(), None);
    while let Some(steps) = verdict.counterexamples.get(property).map(Trace::len) {
        if steps == 0 {
            break;
        }
        // Depth counts states, the initial one included: within `steps - 1`
        // actions is below a depth of `steps + 1`.
        let shorter = run(model.clone(), wanted(), Some(steps + 1));
        match shorter.counterexamples.get(property) {
            Some(trace) => {
                verdict.counterexamples.insert(property, trace.clone());
            }
            None => break,
        }
    }
    verdict
}

fn run(model: IdemModel, finish_when: HasDiscoveries, below_depth: Option<usize>) -> Verdict {
    let started = Instant::now();
    let mut builder = model.clone().checker().finish_when(finish_when.clone());
    if let Some(depth) = below_depth {
        builder = builder.target_max_depth(depth);
    }
    let checker = builder.spawn_bfs().join();
    let elapsed = started.elapsed();
    let mut discoveries = checker.discoveries();
    let found: BTreeSet<&'static str> = discoveries.keys().copied().collect();
    let stopped_early = finish_when.matches(&found, &model.properties());
    let exhaustive = checker.is_done() && !stopped_early && below_depth.is_none();
    let mut counterexamples = BTreeMap::new();
    let mut unreached = Vec::new();
    for property in model.properties() {
        let found = discoveries.remove(property.name);
        match (property.expectation, found) {
            (Expectation::Sometimes, None) if exhaustive => unreached.push(property.name),
            (Expectation::Sometimes, _) | (_, None) => {}
            (_, Some(path)) => {
                counterexamples.insert(property.name, Trace::new(&model, path));
            }
        }
    }
    Verdict {
        unique_states: checker.unique_state_count(),
        max_depth: checker.max_depth(),
        exhaustive,
        elapsed,
        counterexamples,
        unreached,
    }
}

/// One line of a trace: `action`, taken in `before`, leading to `after`.
fn describe(model: &IdemModel, before: &State, action: Action, after: &State) -> String {
    let attempt = |i: u8| {
        let a = before.instances[usize::from(i)].expect("an attempt");
        let spec = model.clients[usize::from(a.client)];
        format!(
            "instance {i} [client {} key {} fp {}, token {}]",
            a.client, spec.key, spec.fingerprint, a.token
        )
    };
    let next = |i: u8| match after.instances[usize::from(i)] {
        Some(a) => format!("{:?}", a.step),
        None => "done".to_owned(),
    };
    let step = |i: u8| -> Step { before.instances[usize::from(i)].expect("an attempt").step };
    match action {
        Action::Serve { instance, client } => {
            let spec = model.clients[usize::from(client)];
            format!(
                "client {client} (key {}, fp {}) sends an attempt; instance {instance} takes it with token {}",
                spec.key, spec.fingerprint, before.next_token
            )
        }
        Action::Step(i) => format!("{}: {:?} -> {}", attempt(i), step(i), next(i)),
        Action::RedisError { instance, landed } => format!(
            "{}: Redis fails at {:?}{} -> {}",
            attempt(instance),
            step(instance),
            if landed {
                " (the command ran all the same)"
            } else {
                ""
            },
            next(instance)
        ),
        Action::HandlerFails(i) => format!("{}: the handler fails -> {}", attempt(i), next(i)),
        Action::Renew(i) => format!("{}: renews its lease", attempt(i)),
        Action::Crash(i) => format!("{}: CRASH", attempt(i)),
        Action::Tick => format!(
            "the clock ticks to {}{}",
            after.now,
            if after.used.stalls > before.used.stalls {
                " past a live owner's lease (a stall)"
            } else {
                ""
            }
        ),
        Action::LoseKey(k) => format!("Redis loses key {k}"),
    }
}
