//! A compact, versioned binary form of [`Record`].
//!
//! The layout puts the state and the owner at fixed offsets so that a Lua
//! script can compare owners without decoding the rest:
//!
//! ```text
//! byte 0      version (1)
//! byte 1      b'I' in flight | b'C' completed
//! in flight:  owner[16] fingerprint[32]
//! completed:  fingerprint[32] then b'N' (not replayable)
//!             or b'R' status:u16 fields body_len:u32 body
//!             or b'T' status:u16 fields body_len:u32 body fields    (with trailers)
//! fields:     count:u16 {name_len:u16 name value_len:u32 value}*
//! ```
//!
//! A response without trailers is written as `R`, as before trailers were
//! kept, so that a record any version wrote is read by every version since.
//! All integers big-endian.

use std::fmt;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};

use super::{Outcome, OwnerToken, Record};
use crate::{Fingerprint, StoredResponse};

const VERSION: u8 = 1;

impl Record {
    /// The record as bytes, for stores that keep it as one value.
    ///
    /// ```
    /// use idem_core::{Fingerprint, OwnerToken, Record};
    ///
    /// let record = Record::InFlight {
    ///     owner: OwnerToken::generate(),
    ///     fingerprint: Fingerprint::from_bytes([7; 32]),
    /// };
    /// assert_eq!(Record::decode(&record.encode())?, record);
    /// # Ok::<(), idem_core::DecodeError>(())
    /// ```
    pub fn encode(&self) -> Bytes {
        let mut out = BytesMut::with_capacity(64);
        out.put_u8(VERSION);
        match self {
            Self::InFlight { owner, fingerprint } => {
                out.put_u8(b'I');
                out.put_slice(owner.as_bytes());
                out.put_slice(fingerprint.as_bytes());
            }
            Self::Completed {
                fingerprint,
                outcome,
            } => {
                out.put_u8(b'C');
                out.put_slice(fingerprint.as_bytes());
                encode_outcome(&mut out, outcome);
            }
        }
        out.freeze()
    }

    /// Decodes what [`Record::encode`] wrote. Anything else, truncated or
    /// trailing bytes included, is a [`DecodeError`], never a panic.
    pub fn decode(mut bytes: &[u8]) -> Result<Self, DecodeError> {
        let buf = &mut bytes;
        let version = take_u8(buf)?;
        if version != VERSION {
            return Err(DecodeError::Version(version));
        }
        let record = match take_u8(buf)? {
            b'I' => Self::InFlight {
                owner: OwnerToken::from_bytes(take_array(buf)?),
                fingerprint: Fingerprint::from_bytes(take_array(buf)?),
            },
            b'C' => Self::Completed {
                fingerprint: Fingerprint::from_bytes(take_array(buf)?),
                outcome: decode_outcome(buf)?,
            },
            other => return Err(DecodeError::Tag(other)),
        };
        if buf.has_remaining() {
            return Err(DecodeError::Trailing);
        }
        Ok(record)
    }
}

impl Outcome {
    /// The outcome as bytes, for stores that keep it in a column of its own.
    pub fn encode(&self) -> Bytes {
        let mut out = BytesMut::new();
        encode_outcome(&mut out, self);
        out.freeze()
    }

    /// Decodes what [`Outcome::encode`] wrote.
    pub fn decode(mut bytes: &[u8]) -> Result<Self, DecodeError> {
        let outcome = decode_outcome(&mut bytes)?;
        if bytes.has_remaining() {
            return Err(DecodeError::Trailing);
        }
        Ok(outcome)
    }
}

fn encode_outcome(out: &mut BytesMut, outcome: &Outcome) {
    match outcome {
        Outcome::NotReplayable => out.put_u8(b'N'),
        Outcome::Response(response) => {
            out.reserve(response.size() + 16);
            out.put_u8(if response.trailers().is_some() {
                b'T'
            } else {
                b'R'
            });
            out.put_u16(response.status().as_u16());
            encode_fields(out, response.headers());
            out.put_u32(response.body().len() as u32);
            out.put_slice(response.body());
            if let Some(trailers) = response.trailers() {
                encode_fields(out, trailers);
            }
        }
    }
}

fn encode_fields(out: &mut BytesMut, fields: &HeaderMap) {
    out.put_u16(u16::try_from(fields.len()).unwrap_or(u16::MAX));
    for (name, value) in fields.iter().take(usize::from(u16::MAX)) {
        // Header names are at most 64 KiB by http's own limit.
        out.put_u16(name.as_str().len() as u16);
        out.put_slice(name.as_str().as_bytes());
        out.put_u32(value.len() as u32);
        out.put_slice(value.as_bytes());
    }
}

fn decode_fields(buf: &mut &[u8]) -> Result<HeaderMap, DecodeError> {
    let count = take_u16(buf)?;
    // Each field takes at least 7 bytes (2 + name + 4 + value), so the
    // bytes present bound the count whatever the input claims; the fallible
    // calls turn http's own limits into errors.
    let capacity = usize::from(count).min(buf.len() / 7);
    let mut fields =
        HeaderMap::try_with_capacity(capacity).map_err(|_| DecodeError::Invalid("header count"))?;
    for _ in 0..count {
        let len = usize::from(take_u16(buf)?);
        let name = HeaderName::from_bytes(take_slice(buf, len)?)
            .map_err(|_| DecodeError::Invalid("header name"))?;
        let len = take_u32(buf)? as usize;
        let value = HeaderValue::from_bytes(take_slice(buf, len)?)
            .map_err(|_| DecodeError::Invalid("header value"))?;
        fields
            .try_append(name, value)
            .map_err(|_| DecodeError::Invalid("header count"))?;
    }
    Ok(fields)
}

fn decode_outcome(buf: &mut &[u8]) -> Result<Outcome, DecodeError> {
    match take_u8(buf)? {
        b'N' => Ok(Outcome::NotReplayable),
        tag @ (b'R' | b'T') => {
            let status =
                StatusCode::from_u16(take_u16(buf)?).map_err(|_| DecodeError::Invalid("status"))?;
            let headers = decode_fields(buf)?;
            let len = take_u32(buf)? as usize;
            let body = Bytes::copy_from_slice(take_slice(buf, len)?);
            let mut response = StoredResponse::new(status, headers, body);
            if tag == b'T' {
                let trailers = decode_fields(buf)?;
                if trailers.is_empty() {
                    return Err(DecodeError::Invalid("empty trailers"));
                }
                response = response.with_trailers(trailers);
            }
            Ok(Outcome::Response(response))
        }
        other => Err(DecodeError::Tag(other)),
    }
}

fn take_slice<'a>(buf: &mut &'a [u8], len: usize) -> Result<&'a [u8], DecodeError> {
    if buf.len() < len {
        return Err(DecodeError::Truncated);
    }
    let (head, tail) = buf.split_at(len);
    *buf = tail;
    Ok(head)
}

fn take_array<const N: usize>(buf: &mut &[u8]) -> Result<[u8; N], DecodeError> {
    let mut out = [0; N];
    out.copy_from_slice(take_slice(buf, N)?);
    Ok(out)
}

fn take_u8(buf: &mut &[u8]) -> Result<u8, DecodeError> {
    Ok(take_array::<1>(buf)?[0])
}

fn take_u16(buf: &mut &[u8]) -> Result<u16, DecodeError> {
    Ok(u16::from_be_bytes(take_array(buf)?))
}

fn take_u32(buf: &mut &[u8]) -> Result<u32, DecodeError> {
    Ok(u32::from_be_bytes(take_array(buf)?))
}

/// Why stored bytes are not a record this version can read.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum DecodeError {
    /// Written by a format version this code does not know.
    Version(u8),
    /// An unknown state or outcome tag.
    Tag(u8),
    /// The bytes end early.
    Truncated,
    /// Bytes left over after a whole record.
    Trailing,
    /// A field that does not hold a valid value.
    Invalid(&'static str),
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Version(v) => write!(f, "unknown record format version {v}"),
            Self::Tag(t) => write!(f, "unknown record tag {t:#04x}"),
            Self::Truncated => f.write_str("record truncated"),
            Self::Trailing => f.write_str("trailing bytes after record"),
            Self::Invalid(what) => write!(f, "invalid {what} in record"),
        }
    }
}

impl std::error::Error for DecodeError {}

impl From<DecodeError> for crate::Error {
    fn from(err: DecodeError) -> Self {
        crate::Error::new(crate::ErrorKind::Corrupt, err)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn completed(headers: HeaderMap, body: &'static [u8]) -> Record {
        Record::Completed {
            fingerprint: Fingerprint::from_bytes([3; 32]),
            outcome: Outcome::Response(StoredResponse::new(StatusCode::CREATED, headers, body)),
        }
    }

    #[test]
    fn round_trips_repeated_and_non_utf8_headers() {
        let mut headers = HeaderMap::new();
        headers.append("link", HeaderValue::from_static("<a>"));
        headers.append("link", HeaderValue::from_static("<b>"));
        headers.append("x-bin", HeaderValue::from_bytes(b"caf\xe9").unwrap());
        let record = completed(headers, b"\x00body\xff");
        let decoded = Record::decode(&record.encode()).unwrap();
        assert_eq!(decoded, record);
        let Record::Completed {
            outcome: Outcome::Response(r),
            ..
        } = decoded
        else {
            panic!("expected a response")
        };
        let links: Vec<_> = r.headers().get_all("link").iter().collect();
        assert_eq!(links, ["<a>", "<b>"]);
    }

    #[test]
    fn round_trips_trailers_and_writes_a_response_without_them_as_before() {
        let mut trailers = HeaderMap::new();
        trailers.insert("grpc-status", HeaderValue::from_static("3"));
        trailers.insert("grpc-message", HeaderValue::from_static("bad%20amount"));
        trailers.insert(
            "grpc-status-details-bin",
            HeaderValue::from_bytes(b"CAM").unwrap(),
        );
        let plain = StoredResponse::new(StatusCode::OK, HeaderMap::new(), &b"\x00\x00"[..]);
        let with = Outcome::Response(plain.clone().with_trailers(trailers.clone()));
        let encoded = with.encode();
        assert_eq!(encoded[0], b'T');
        let Outcome::Response(decoded) = Outcome::decode(&encoded).unwrap() else {
            panic!("expected a response")
        };
        assert_eq!(decoded.trailers(), Some(&trailers));
        assert_eq!(Outcome::Response(decoded), with);

        // Without trailers: the `R` layout records written before trailers
        // were kept have, byte for byte.
        let without = Outcome::Response(plain.with_trailers(HeaderMap::new())).encode();
        assert_eq!(&without[..], b"R\x00\xc8\x00\x00\x00\x00\x00\x02\x00\x00");
    }

    #[test]
    fn round_trips_not_replayable() {
        let record = Record::Completed {
            fingerprint: Fingerprint::from_bytes([1; 32]),
            outcome: Outcome::NotReplayable,
        };
        assert_eq!(Record::decode(&record.encode()).unwrap(), record);
        assert_eq!(
            Outcome::decode(&Outcome::NotReplayable.encode()).unwrap(),
            Outcome::NotReplayable
        );
    }

    #[test]
    fn owner_sits_at_a_fixed_offset() {
        let owner = OwnerToken::generate();
        let bytes = Record::InFlight {
            owner,
            fingerprint: Fingerprint::from_bytes([0; 32]),
        }
        .encode();
        assert_eq!(&bytes[..2], b"\x01I");
        assert_eq!(&bytes[2..18], owner.as_bytes());
    }

    /// The Redis scripts build a completed record from an in-flight one
    /// without decoding it: version, `C`, the fingerprint at bytes 2..34 of
    /// the in-flight record, then the outcome's own encoding.
    #[test]
    fn completed_is_version_tag_fingerprint_outcome() {
        let fingerprint = Fingerprint::from_bytes([5; 32]);
        let in_flight = Record::InFlight {
            owner: OwnerToken::generate(),
            fingerprint,
        }
        .encode();
        let outcome = Outcome::NotReplayable;
        let completed = Record::Completed {
            fingerprint,
            outcome: outcome.clone(),
        }
        .encode();
        let mut expected = b"\x01C".to_vec();
        expected.extend_from_slice(&in_flight[18..50]);
        expected.extend_from_slice(&outcome.encode());
        assert_eq!(&completed[..], &expected[..]);
    }

    /// Found by the `record_decode` fuzz target: a header count over what
    /// `HeaderMap` can hold made `with_capacity` panic.
    #[test]
    fn a_header_count_over_http_capacity_is_an_error_not_a_panic() {
        assert_eq!(
            Outcome::decode(b"R\x00\xc8\x60\x01"),
            Err(DecodeError::Truncated)
        );
        let mut record = b"\x01C".to_vec();
        record.extend([0; 32]);
        record.extend(b"R\x00\xc8\xff\xff");
        assert_eq!(Record::decode(&record), Err(DecodeError::Truncated));
    }

    #[test]
    fn every_truncation_is_an_error_not_a_panic() {
        let mut headers = HeaderMap::new();
        headers.insert("etag", HeaderValue::from_static("\"x\""));
        let bytes = completed(headers, b"hello").encode();
        for end in 0..bytes.len() {
            assert!(Record::decode(&bytes[..end]).is_err(), "prefix {end}");
        }
        let mut extra = bytes.to_vec();
        extra.push(0);
        assert_eq!(Record::decode(&extra), Err(DecodeError::Trailing));
        assert_eq!(Record::decode(b"\x09I"), Err(DecodeError::Version(9)));
    }
}
