//! Many plain writes in one statement, for a batch (`sql/batch.rs`): the
//! values of every claim, or of every completion, go in as one JSON array
//! that `json_each` reads row by row, so a batch of any size is one
//! statement (and one cached prepared statement) per kind. Bytes travel as
//! hex and are turned back by `unhex`.
//!
//! Each statement writes a key at most once: a second write of a key already
//! in it is left to run on its own after it, so one statement never takes
//! over a row it wrote itself.

use std::sync::Arc;

use serde::Serialize;
use sqlx::sqlite::SqliteConnection;
use sqlx::{AssertSqlSafe, Row, Sqlite};

use super::take_over_expired;
use crate::batch::{Write, Written};
use crate::dialect::Dialect;
use idem_core::{Claim, Error};

/// A claim's values, as `claim_sql` reads them.
#[derive(Serialize)]
struct ClaimValues<'a> {
    /// Key hash, hex.
    h: String,
    /// Key.
    k: &'a str,
    /// Owner, hex.
    o: String,
    /// Fingerprint, hex.
    f: String,
    /// Lease, ms.
    l: i64,
}

/// A completion's values, as `complete_sql` reads them.
#[derive(Serialize)]
struct CompleteValues {
    /// Key hash, hex.
    h: String,
    /// Owner, hex.
    o: String,
    /// Encoded outcome, hex.
    u: String,
    /// Retention, ms.
    r: i64,
}

/// Inserts every claim of the array, or takes over an expired row, as the
/// one claim statement does; returns the owners of those acquired.
fn claim_sql(table: &str) -> String {
    format!(
        "INSERT INTO {table} AS r \
           (key_hash, idem_key, state, owner, fingerprint, outcome, expires_at) \
         SELECT unhex(c.value ->> 'h'), c.value ->> 'k', 'I', unhex(c.value ->> 'o'), \
           unhex(c.value ->> 'f'), NULL, {lease_end} \
         FROM json_each(?1) AS c WHERE true {take_over} \
         RETURNING owner",
        lease_end = Sqlite::now_plus_ms("(c.value ->> 'l')"),
        take_over = take_over_expired(),
    )
}

/// Completes every row of the array that is in flight and its owner's, as
/// the one completion does; returns the key hashes of those completed.
fn complete_sql(table: &str) -> String {
    format!(
        "UPDATE {table} AS r SET state = 'C', owner = NULL, \
           outcome = unhex(c.value ->> 'u'), expires_at = {ttl_end} \
         FROM json_each(?1) AS c \
         WHERE r.key_hash = unhex(c.value ->> 'h') AND r.state = 'I' \
           AND r.owner = unhex(c.value ->> 'o') \
         RETURNING key_hash",
        ttl_end = Sqlite::now_plus_ms("(c.value ->> 'r')"),
    )
}

/// The claims of `writes`, each key's first, in one statement when there
/// are two or more: those it acquired are answered in `written`, the rest
/// left to run alone.
pub(super) async fn claim(
    conn: &mut SqliteConnection,
    table: &str,
    writes: &[&Write],
    written: &mut [Option<Result<Written, Error>>],
) {
    let mut keys = Vec::new();
    let claims: Vec<(usize, ClaimValues<'_>)> = writes
        .iter()
        .enumerate()
        .filter_map(|(i, write)| match write {
            Write::Claim {
                key,
                key_hash,
                fingerprint,
                lease,
                owner,
            } if first_of_key(&mut keys, key_hash) => Some((
                i,
                ClaimValues {
                    h: hex::encode(key_hash),
                    k: key.as_str(),
                    o: hex::encode(owner.as_bytes()),
                    f: hex::encode(fingerprint.as_bytes()),
                    l: idem_core::expiry_millis(*lease),
                },
            )),
            _ => None,
        })
        .collect();
    if claims.len() < 2 {
        return;
    }
    let values: Vec<&ClaimValues<'_>> = claims.iter().map(|(_, values)| values).collect();
    let acquired = run(conn, claim_sql(table), &values).await;
    for (i, _) in &claims {
        let Write::Claim { owner, .. } = writes[*i] else {
            continue;
        };
        written[*i] = match &acquired {
            Ok(owners) if owners.iter().any(|o| o[..] == owner.as_bytes()[..]) => {
                Some(Ok(Written::Claim(Claim::Acquired(*owner))))
            }
            // Not acquired: run alone, it reads what is in the way.
            Ok(_) => None,
            Err(err) => Some(Err(Error::unavailable(Arc::clone(err)))),
        };
    }
}

/// The completions of `writes`, each key's first, in one statement when
/// there are two or more, answered in `written`.
pub(super) async fn complete(
    conn: &mut SqliteConnection,
    table: &str,
    writes: &[&Write],
    written: &mut [Option<Result<Written, Error>>],
) {
    let mut keys = Vec::new();
    let completions: Vec<(usize, &[u8; 32], CompleteValues)> = writes
        .iter()
        .enumerate()
        .filter_map(|(i, write)| match write {
            Write::Complete {
                key_hash,
                owner,
                outcome,
                ttl_ms,
            } if first_of_key(&mut keys, key_hash) => Some((
                i,
                key_hash,
                CompleteValues {
                    h: hex::encode(key_hash),
                    o: hex::encode(owner.as_bytes()),
                    u: hex::encode(outcome),
                    r: *ttl_ms,
                },
            )),
            _ => None,
        })
        .collect();
    if completions.len() < 2 {
        return;
    }
    let values: Vec<&CompleteValues> = completions.iter().map(|(_, _, values)| values).collect();
    let completed = run(conn, complete_sql(table), &values).await;
    for (i, key_hash, _) in &completions {
        written[*i] = Some(match &completed {
            Ok(hashes) => Ok(Written::Fenced(
                hashes.iter().any(|h| h[..] == key_hash[..]),
            )),
            Err(err) => Err(Error::unavailable(Arc::clone(err))),
        });
    }
}

/// Whether `key_hash` is not in `keys` yet; adds it.
fn first_of_key<'a>(keys: &mut Vec<&'a [u8; 32]>, key_hash: &'a [u8; 32]) -> bool {
    if keys.contains(&key_hash) {
        return false;
    }
    keys.push(key_hash);
    true
}

/// Runs `sql` with `values` as its one JSON parameter; the first column of
/// every row it returns. One error for all the writes it carried.
async fn run<T: Serialize>(
    conn: &mut SqliteConnection,
    sql: String,
    values: &[T],
) -> Result<Vec<Vec<u8>>, Arc<sqlx::Error>> {
    let json = serde_json::to_string(values).map_err(|err| sqlx::Error::Encode(err.into()))?;
    let rows = sqlx::query(AssertSqlSafe(sql))
        .bind(json)
        .fetch_all(&mut *conn)
        .await?;
    rows.iter()
        .map(|row| row.try_get(0))
        .collect::<Result<_, _>>()
        .map_err(Arc::new)
}
