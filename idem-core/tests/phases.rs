//! Phases on the memory points (`idem-core/src/phases/`): what runs again
//! and what resumes, counted. The SQL stores, whose phases commit their
//! writes with their points, are checked on real servers in
//! `idem-sql/tests/stores/phases.rs`.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use idem_core::{Error, ErrorKind, MemoryPoints, Phases};

const KEEP: Duration = Duration::from_secs(60);

#[derive(Default)]
struct Ran {
    first: AtomicUsize,
    second: AtomicUsize,
}

/// Two phases, the run failing after the first if `fail`.
async fn run(points: &MemoryPoints, ran: &Ran, fail: bool) -> Result<(u64, u64), Error> {
    let phases = Phases::new(points, [1; 32], KEEP);
    let first: u64 = phases
        .transaction("first", |()| async {
            Ok::<_, Error>(ran.first.fetch_add(1, Ordering::SeqCst) as u64 + 100)
        })
        .await?;
    if fail {
        return Err(Error::unavailable("the run stopped"));
    }
    let second: u64 = phases
        .call("second", || async {
            Ok::<_, Error>(ran.second.fetch_add(1, Ordering::SeqCst) as u64 + first)
        })
        .await?;
    Ok((first, second))
}

#[tokio::test]
async fn a_run_resumes_after_the_last_finished_phase_with_its_output() {
    let (points, ran) = (MemoryPoints::new(), Ran::default());
    run(&points, &ran, true).await.unwrap_err();
    let phases = Phases::new(&points, [1; 32], KEEP);
    assert_eq!(phases.finished().await.unwrap(), 1);

    assert_eq!(run(&points, &ran, false).await.unwrap(), (100, 100));
    assert_eq!(run(&points, &ran, false).await.unwrap(), (100, 100));
    assert_eq!(ran.first.load(Ordering::SeqCst), 1);
    assert_eq!(ran.second.load(Ordering::SeqCst), 1);
    assert_eq!(phases.finished().await.unwrap(), 2);
}

#[tokio::test]
async fn a_failed_phase_records_nothing() {
    let points = MemoryPoints::new();
    let phases = Phases::new(&points, [2; 32], KEEP);
    let failed: Result<u64, Error> = phases
        .call("charge", || async { Err(Error::unavailable("502")) })
        .await;
    assert_eq!(failed.unwrap_err().kind(), ErrorKind::Unavailable);
    assert!(points.is_empty());
    let charged: u64 = phases
        .call("charge", || async { Ok::<_, Error>(7) })
        .await
        .unwrap();
    assert_eq!(charged, 7);
}

#[tokio::test]
async fn operations_and_names_keep_their_own_points() {
    let points = MemoryPoints::new();
    let a = Phases::new(&points, [3; 32], KEEP);
    let b = Phases::new(&points, [4; 32], KEEP);
    let one: u32 = a.call("x", || async { Ok::<_, Error>(1) }).await.unwrap();
    let two: u32 = b.call("x", || async { Ok::<_, Error>(2) }).await.unwrap();
    let three: u32 = a.call("y", || async { Ok::<_, Error>(3) }).await.unwrap();
    assert_eq!((one, two, three), (1, 2, 3));
    assert_eq!(a.finished().await.unwrap(), 2);
    assert_eq!(b.finished().await.unwrap(), 1);
}

#[tokio::test]
async fn names_no_store_can_key_are_refused() {
    let points = MemoryPoints::new();
    let phases = Phases::new(&points, [5; 32], KEEP);
    for name in [String::new(), "x".repeat(256)] {
        let refused: Result<u32, Error> = phases.call(&name, || async { Ok(1) }).await;
        assert_eq!(refused.unwrap_err().kind(), ErrorKind::Config);
    }
}

#[tokio::test]
async fn an_output_that_no_longer_reads_is_corrupt() {
    let points = MemoryPoints::new();
    let phases = Phases::new(&points, [6; 32], KEEP);
    let _: String = phases
        .call("id", || async { Ok::<_, Error>("ch_1".to_owned()) })
        .await
        .unwrap();
    let read: Result<u64, Error> = phases.call("id", || async { Ok(1) }).await;
    assert_eq!(read.unwrap_err().kind(), ErrorKind::Corrupt);
}

#[tokio::test]
async fn expired_points_count_as_absent() {
    let points = MemoryPoints::new();
    let phases = Phases::new(&points, [7; 32], Duration::from_millis(20));
    let _: u8 = phases
        .call("x", || async { Ok::<_, Error>(1) })
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(40)).await;
    assert_eq!(phases.finished().await.unwrap(), 0);
    let again: u8 = phases
        .call("x", || async { Ok::<_, Error>(2) })
        .await
        .unwrap();
    assert_eq!(again, 2);
    assert_eq!(points.purge_expired(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_runs_go_on_from_one_output() {
    let points = MemoryPoints::new();
    let ran = Arc::new(AtomicUsize::new(0));
    let runs: Vec<_> = (0..8)
        .map(|_| {
            let (points, ran) = (points.clone(), Arc::clone(&ran));
            tokio::spawn(async move {
                let phases = Phases::new(&points, [8; 32], KEEP);
                phases
                    .call("charge", || async {
                        Ok::<_, Error>(ran.fetch_add(1, Ordering::SeqCst))
                    })
                    .await
                    .unwrap()
            })
        })
        .collect();
    let mut outputs = Vec::new();
    for run in runs {
        outputs.push(run.await.unwrap());
    }
    // However many ran the call, every run goes on from the one recorded.
    assert!(outputs.iter().all(|o| *o == outputs[0]), "{outputs:?}");
    assert_eq!(points.len(), 1);
}
