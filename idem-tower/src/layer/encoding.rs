//! Compression on both halves of a request (ARCHITECTURE.md, "Compression"):
//! the request's message decoded for its fingerprint, so that compression
//! never makes a retry another request; and a replay sent in an encoding
//! its requester accepts.
//!
//! The codings are the ones tonic speaks, gzip, deflate (zlib) and zstd,
//! named the same in HTTP's `Content-Encoding` and gRPC's `grpc-encoding`.
//! A coding the layer does not know leaves the bytes as they are: the
//! service decides what to make of them.

use std::io::Read;

use bytes::{BufMut, Bytes, BytesMut};
use http::{HeaderMap, HeaderValue, header};

use super::grpc;

/// `grpc-encoding`: the coding of a gRPC message flagged compressed.
const GRPC_ENCODING: &str = "grpc-encoding";
/// `grpc-accept-encoding`: the codings a gRPC peer reads.
const GRPC_ACCEPT_ENCODING: &str = "grpc-accept-encoding";

/// A coding the layer decodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Coding {
    Gzip,
    Deflate,
    Zstd,
}

impl Coding {
    /// The coding a token names (`x-gzip` is gzip, RFC 9110), if known.
    fn named(token: &str) -> Option<Self> {
        let token = token.trim();
        if token.eq_ignore_ascii_case("gzip") || token.eq_ignore_ascii_case("x-gzip") {
            Some(Self::Gzip)
        } else if token.eq_ignore_ascii_case("deflate") {
            Some(Self::Deflate)
        } else if token.eq_ignore_ascii_case("zstd") {
            Some(Self::Zstd)
        } else {
            None
        }
    }

    fn bit(self) -> u8 {
        match self {
            Self::Gzip => 1,
            Self::Deflate => 2,
            Self::Zstd => 4,
        }
    }

    /// `data` decoded, at most `limit` bytes of it.
    pub(super) fn decode(self, data: &[u8], limit: usize) -> Result<Vec<u8>, Undecodable> {
        let mut out = Vec::new();
        // One byte past the cap tells "over it" from "exactly at it".
        let cap = u64::try_from(limit).unwrap_or(u64::MAX).saturating_add(1);
        let read = match self {
            Self::Gzip => flate2::read::GzDecoder::new(data)
                .take(cap)
                .read_to_end(&mut out),
            Self::Deflate => flate2::read::ZlibDecoder::new(data)
                .take(cap)
                .read_to_end(&mut out),
            Self::Zstd => match ruzstd::decoding::StreamingDecoder::new(data) {
                Ok(decoder) => decoder.take(cap).read_to_end(&mut out),
                Err(err) => return Err(Undecodable::Corrupt(format!("zstd: {err}"))),
            },
        };
        match read {
            Ok(_) if out.len() > limit => Err(Undecodable::TooLarge),
            Ok(_) => Ok(out),
            Err(err) => Err(Undecodable::Corrupt(format!("{self:?}: {err}"))),
        }
    }
}

/// Why a message could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Undecodable {
    /// Decoded, it is larger than the cap.
    TooLarge,
    /// It is not what its encoding says.
    Corrupt(String),
}

/// The request body as its fingerprint sees it: decoded when its encoding
/// is one the layer knows (HTTP's `Content-Encoding`; on gRPC each message
/// flagged compressed, by `grpc-encoding`), at most `limit` bytes once
/// decoded; else the body as sent.
pub(super) fn decoded_request(
    grpc: bool,
    headers: &HeaderMap,
    body: &Bytes,
    limit: usize,
) -> Result<Bytes, Undecodable> {
    if grpc {
        let coding = headers
            .get(GRPC_ENCODING)
            .and_then(|v| v.to_str().ok())
            .and_then(Coding::named);
        return match coding {
            Some(coding) => {
                grpc_messages(body, |payload, left| coding.decode(payload, left), limit)
            }
            None => Ok(body.clone()),
        };
    }
    match content_codings(headers) {
        Some(codings) if !codings.is_empty() => decode_all(&codings, body, limit).map(Bytes::from),
        _ => Ok(body.clone()),
    }
}

/// The codings of `Content-Encoding`, in the order applied (`identity`
/// left out); `None` if one is unknown.
fn content_codings(headers: &HeaderMap) -> Option<Vec<Coding>> {
    let mut codings = Vec::new();
    for value in headers.get_all(header::CONTENT_ENCODING) {
        for token in value.to_str().ok()?.split(',') {
            let token = token.trim();
            if token.is_empty() || token.eq_ignore_ascii_case("identity") {
                continue;
            }
            codings.push(Coding::named(token)?);
        }
    }
    Some(codings)
}

/// `data` with every coding undone, the last applied first.
fn decode_all(codings: &[Coding], data: &[u8], limit: usize) -> Result<Vec<u8>, Undecodable> {
    let mut data = data.to_vec();
    for coding in codings.iter().rev() {
        data = coding.decode(&data, limit)?;
    }
    Ok(data)
}

/// A gRPC body (5-byte-prefixed messages: a compressed flag, a big-endian
/// length) with each message flagged compressed passed through `decode`
/// and flagged uncompressed; uncompressed ones, and a cut-off tail, as they
/// are. At most `limit` bytes in all.
fn grpc_messages(
    body: &[u8],
    mut decode: impl FnMut(&[u8], usize) -> Result<Vec<u8>, Undecodable>,
    limit: usize,
) -> Result<Bytes, Undecodable> {
    let mut out = BytesMut::with_capacity(body.len());
    let mut rest = body;
    while rest.len() >= 5 {
        let flag = rest[0];
        let len = u32::from_be_bytes([rest[1], rest[2], rest[3], rest[4]]) as usize;
        if rest.len() - 5 < len {
            break;
        }
        let payload = &rest[5..5 + len];
        if flag & 1 == 1 {
            let left = limit.saturating_sub(out.len() + 5);
            let message = decode(payload, left)?;
            let Ok(len) = u32::try_from(message.len()) else {
                return Err(Undecodable::TooLarge);
            };
            out.put_u8(flag & !1);
            out.put_u32(len);
            out.extend_from_slice(&message);
        } else {
            out.extend_from_slice(&rest[..5 + len]);
        }
        if out.len() > limit {
            return Err(Undecodable::TooLarge);
        }
        rest = &rest[5 + len..];
    }
    out.extend_from_slice(rest);
    Ok(out.freeze())
}

/// The codings a requester reads, from its `Accept-Encoding` (HTTP) or
/// `grpc-accept-encoding` (gRPC). Without the header, none but identity:
/// a replay is then sent decoded, as a first response would have been.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(super) struct Accepts(u8);

impl Accepts {
    /// What a request with these headers accepts.
    pub(super) fn of(headers: &HeaderMap) -> Self {
        let grpc = grpc::is_grpc(headers);
        let name = if grpc {
            GRPC_ACCEPT_ENCODING
        } else {
            header::ACCEPT_ENCODING.as_str()
        };
        let mut accepted = 0;
        let mut refused = 0;
        let mut any = false;
        for value in headers.get_all(name) {
            let Ok(value) = value.to_str() else { continue };
            for member in value.split(',') {
                let mut parts = member.split(';');
                let token = parts.next().unwrap_or_default().trim();
                // `q=0` says "not this one" (RFC 9110, section 12.5.3).
                let zero = parts.any(|p| {
                    p.trim()
                        .strip_prefix("q=")
                        .and_then(|q| q.trim().parse::<f32>().ok())
                        .is_some_and(|q| q == 0.0)
                });
                if token == "*" && !grpc {
                    any = !zero;
                } else if let Some(coding) = Coding::named(token) {
                    if zero {
                        refused |= coding.bit();
                    } else {
                        accepted |= coding.bit();
                    }
                }
            }
        }
        if any {
            accepted |= !refused & 7;
        }
        Self(accepted)
    }

    fn accepts(self, coding: Coding) -> bool {
        self.0 & coding.bit() != 0
    }
}

/// A stored body and its headers made readable by a requester who accepts
/// `accepts`: as stored when it accepts the body's encoding, else decoded
/// and its encoding header dropped (`Content-Length` too, now wrong). A body
/// in an encoding the layer does not know, or that fails to decode, is
/// sent as stored.
pub(super) fn for_requester(headers: &mut HeaderMap, body: Bytes, accepts: Accepts) -> Bytes {
    if let Some(coding) = headers
        .get(GRPC_ENCODING)
        .and_then(|v| v.to_str().ok())
        .and_then(Coding::named)
    {
        if accepts.accepts(coding) {
            return body;
        }
        // The server made these bytes from messages it held whole: no cap
        // to guard against but the addressable.
        return match grpc_messages(
            &body,
            |payload, _| coding.decode(payload, usize::MAX),
            usize::MAX,
        ) {
            Ok(decoded) => {
                headers.remove(GRPC_ENCODING);
                decoded
            }
            Err(_) => body,
        };
    }
    let Some(codings) = content_codings(headers) else {
        return body;
    };
    if codings.is_empty() || codings.iter().all(|c| accepts.accepts(*c)) {
        return body;
    }
    match decode_all(&codings, &body, usize::MAX) {
        Ok(decoded) => {
            headers.remove(header::CONTENT_ENCODING);
            if headers.contains_key(header::CONTENT_LENGTH) {
                headers.insert(header::CONTENT_LENGTH, HeaderValue::from(decoded.len()));
            }
            Bytes::from(decoded)
        }
        Err(_) => body,
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    pub(crate) fn gzip(data: &[u8]) -> Vec<u8> {
        let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        encoder.write_all(data).unwrap();
        encoder.finish().unwrap()
    }

    fn deflate(data: &[u8]) -> Vec<u8> {
        let mut encoder = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::fast());
        encoder.write_all(data).unwrap();
        encoder.finish().unwrap()
    }

    fn zstd(data: &[u8]) -> Vec<u8> {
        ruzstd::encoding::compress_to_vec(data, ruzstd::encoding::CompressionLevel::Fastest)
    }

    fn frame(flag: u8, payload: &[u8]) -> Vec<u8> {
        let mut out = vec![flag];
        out.extend_from_slice(&(payload.len() as u32).to_be_bytes());
        out.extend_from_slice(payload);
        out
    }

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        pairs
            .iter()
            .map(|(k, v)| {
                (
                    http::HeaderName::from_static(k),
                    HeaderValue::from_static(v),
                )
            })
            .collect()
    }

    const MESSAGE: &[u8] = b"{\"sku\":\"book\",\"qty\":1,\"note\":\"the same message every time\"}";

    #[test]
    fn every_coding_decodes_to_the_identity_body() {
        for (name, encoded) in [
            ("gzip", gzip(MESSAGE)),
            ("deflate", deflate(MESSAGE)),
            ("zstd", zstd(MESSAGE)),
        ] {
            let mut h = HeaderMap::new();
            h.insert(header::CONTENT_ENCODING, HeaderValue::from_static(name));
            let decoded = decoded_request(false, &h, &Bytes::from(encoded), 1024).unwrap();
            assert_eq!(decoded, MESSAGE, "{name}");
        }
        let nested = headers(&[("content-encoding", "deflate, gzip")]);
        let body = Bytes::from(gzip(&deflate(MESSAGE)));
        assert_eq!(
            decoded_request(false, &nested, &body, 1024).unwrap(),
            MESSAGE
        );
        let unknown = headers(&[("content-encoding", "br")]);
        let raw = Bytes::from_static(b"\x0b\x02\x80");
        assert_eq!(decoded_request(false, &unknown, &raw, 1024).unwrap(), raw);
    }

    #[test]
    fn grpc_messages_flagged_compressed_are_decoded_and_flagged_plain() {
        let plain = [frame(0, MESSAGE), frame(0, b"two")].concat();
        for (name, encode) in [
            ("gzip", gzip as fn(&[u8]) -> Vec<u8>),
            ("deflate", deflate),
            ("zstd", zstd),
        ] {
            let mut h = headers(&[("content-type", "application/grpc")]);
            h.insert(GRPC_ENCODING, HeaderValue::from_static(name));
            let mixed = [frame(1, &encode(MESSAGE)), frame(0, b"two")].concat();
            let decoded = decoded_request(true, &h, &Bytes::from(mixed), 1024).unwrap();
            assert_eq!(decoded, plain, "{name}");
        }
        // Without a known grpc-encoding the bytes are the service's business.
        let h = headers(&[("content-type", "application/grpc")]);
        let flagged = Bytes::from(frame(1, b"??"));
        assert_eq!(decoded_request(true, &h, &flagged, 1024).unwrap(), flagged);
    }

    #[test]
    fn a_bomb_is_too_large_and_garbage_is_corrupt() {
        let bomb = gzip(&vec![0; 10 << 20]);
        assert!(bomb.len() < 64 << 10);
        let h = headers(&[("content-encoding", "gzip")]);
        assert_eq!(
            decoded_request(false, &h, &Bytes::from(bomb.clone()), 1 << 20),
            Err(Undecodable::TooLarge)
        );
        let mut g = headers(&[
            ("content-type", "application/grpc"),
            ("grpc-encoding", "gzip"),
        ]);
        let framed = Bytes::from(frame(1, &bomb));
        assert_eq!(
            decoded_request(true, &g, &framed, 1 << 20),
            Err(Undecodable::TooLarge)
        );
        let exact = gzip(&[7; 100]);
        assert!(decoded_request(false, &h, &Bytes::from(exact), 100).is_ok());
        for name in ["gzip", "deflate", "zstd"] {
            let mut h = HeaderMap::new();
            h.insert(
                header::CONTENT_ENCODING,
                HeaderValue::from_str(name).unwrap(),
            );
            let garbage = Bytes::from_static(b"not compressed at all");
            assert!(
                matches!(
                    decoded_request(false, &h, &garbage, 1024),
                    Err(Undecodable::Corrupt(_))
                ),
                "{name}"
            );
        }
        g.insert(GRPC_ENCODING, HeaderValue::from_static("zstd"));
        let garbage = Bytes::from(frame(1, b"garbage"));
        assert!(matches!(
            decoded_request(true, &g, &garbage, 1024),
            Err(Undecodable::Corrupt(_))
        ));
    }

    #[test]
    fn accepted_codings_follow_the_header() {
        let a = Accepts::of(&headers(&[("accept-encoding", "gzip, br;q=0.5")]));
        assert!(a.accepts(Coding::Gzip) && !a.accepts(Coding::Zstd));
        let a = Accepts::of(&headers(&[("accept-encoding", "*, gzip;q=0")]));
        assert!(!a.accepts(Coding::Gzip) && a.accepts(Coding::Zstd));
        assert_eq!(Accepts::of(&HeaderMap::new()), Accepts::default());
        let a = Accepts::of(&headers(&[
            ("content-type", "application/grpc"),
            ("grpc-accept-encoding", "identity,deflate,gzip"),
            ("accept-encoding", "zstd"),
        ]));
        assert!(a.accepts(Coding::Gzip) && a.accepts(Coding::Deflate) && !a.accepts(Coding::Zstd));
    }

    #[test]
    fn a_replay_is_decoded_for_a_requester_without_its_coding() {
        let stored = Bytes::from(gzip(MESSAGE));
        let mut h = headers(&[("content-encoding", "gzip"), ("content-length", "999")]);
        let kept = for_requester(&mut h.clone(), stored.clone(), Accepts(Coding::Gzip.bit()));
        assert_eq!(kept, stored);
        let body = for_requester(&mut h, stored, Accepts::default());
        assert_eq!(body, MESSAGE);
        assert!(!h.contains_key("content-encoding"));
        assert_eq!(h["content-length"], MESSAGE.len().to_string());

        let stored = Bytes::from(frame(1, &gzip(MESSAGE)));
        let mut g = headers(&[
            ("grpc-encoding", "gzip"),
            ("content-type", "application/grpc"),
        ]);
        let body = for_requester(&mut g, stored, Accepts::default());
        assert_eq!(body, frame(0, MESSAGE));
        assert!(!g.contains_key(GRPC_ENCODING));
    }
}
