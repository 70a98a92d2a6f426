//! HTTP/1.1 as the API speaks it, apart from what it serves: a request's head and body
//! parsed within bounds, and an answer written. Pure but for [`respond`]'s writes.

use std::io::Write;

use serde_json::{Value, json};

/// Longest request head (request line and headers).
pub const MAX_HEAD: usize = 8 << 10;
/// Longest request body.
pub const MAX_BODY: usize = 4 << 10;

/// An HTTP answer.
#[derive(Debug, PartialEq)]
pub struct Response {
    /// Status code.
    pub code: u16,
    /// JSON body.
    pub body: Value,
}

impl Response {
    /// A 2xx answer with `body` serialized.
    pub fn ok(code: u16, body: &impl serde::Serialize) -> Self {
        match serde_json::to_value(body) {
            Ok(body) => Self { code, body },
            Err(e) => err(500, format!("the answer did not serialize: {e}")),
        }
    }
}

/// A 4xx or 5xx answer: `{"error": why}` (the API's `Error` schema).
pub fn err(code: u16, why: impl Into<String>) -> Response {
    Response {
        code,
        body: json!({ "error": why.into() }),
    }
}

fn reason(code: u16) -> &'static str {
    match code {
        200 => "OK",
        202 => "Accepted",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        413 => "Payload Too Large",
        500 => "Internal Server Error",
        503 => "Service Unavailable",
        _ => "Error",
    }
}

/// A parsed request: method, path, body.
#[derive(Debug, PartialEq)]
pub struct Request {
    /// Method.
    pub method: String,
    /// Path (without a query).
    pub path: String,
    /// Body.
    pub body: Vec<u8>,
}

/// Parses a request head (up to and without the blank line) and says how long its body is.
pub fn parse_head(head: &[u8]) -> Result<(String, String, usize), Response> {
    let text = std::str::from_utf8(head).map_err(|_| err(400, "the request is not UTF-8"))?;
    let mut lines = text.split("\r\n");
    let line = lines.next().unwrap_or("");
    let mut parts = line.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(err(400, format!("not an HTTP request line: {line:?}")));
    };
    if !version.starts_with("HTTP/1.") {
        return Err(err(400, format!("not HTTP/1.x: {version:?}")));
    }
    if method.is_empty() || !method.bytes().all(|b| b.is_ascii_uppercase()) {
        return Err(err(400, format!("not a method: {method:?}")));
    }
    let path = target.split('?').next().unwrap_or("").to_string();
    if !path.starts_with('/') {
        return Err(err(400, format!("not a path: {target:?}")));
    }
    let mut len = 0usize;
    for h in lines {
        let Some((k, v)) = h.split_once(':') else {
            return Err(err(400, format!("not a header: {h:?}")));
        };
        if k.trim().eq_ignore_ascii_case("content-length") {
            len = v
                .trim()
                .parse()
                .map_err(|_| err(400, format!("Content-Length {:?}", v.trim())))?;
        } else if k.trim().eq_ignore_ascii_case("transfer-encoding") {
            return Err(err(400, "chunked bodies are not accepted"));
        }
    }
    if len > MAX_BODY {
        return Err(err(
            413,
            format!("a body of {len} bytes; at most {MAX_BODY}"),
        ));
    }
    Ok((method.to_string(), path, len))
}

/// A whole request in `buf`, if it has arrived: Ok(None) while it is incomplete, the 4xx
/// to answer when it breaks the limits or does not parse.
pub fn parse_request(buf: &[u8]) -> Result<Option<Request>, Response> {
    let Some(head_end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
        if buf.len() > MAX_HEAD {
            return Err(err(413, format!("a request head over {MAX_HEAD} bytes")));
        }
        return Ok(None);
    };
    let (method, path, len) = parse_head(&buf[..head_end])?;
    let body = &buf[head_end + 4..];
    if body.len() < len {
        return Ok(None);
    }
    Ok(Some(Request {
        method,
        path,
        body: body[..len].to_vec(),
    }))
}

/// Writes `r` and nothing after it (`Connection: close`); a peer that went away is not an
/// error of ours.
pub fn respond(s: &mut impl Write, r: &Response) {
    let body = r.body.to_string();
    let head = format!(
        "HTTP/1.1 {} {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        r.code,
        reason(r.code),
        body.len() + 1
    );
    let _ = s.write_all(head.as_bytes());
    let _ = s.write_all(body.as_bytes());
    let _ = s.write_all(b"\n");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_heads_parse_or_get_4xx() {
        assert_eq!(
            parse_head(b"GET /state HTTP/1.1\r\nHost: x").unwrap(),
            ("GET".into(), "/state".into(), 0)
        );
        assert_eq!(
            parse_head(b"PUT /state?x=1 HTTP/1.0\r\ncontent-length: 20").unwrap(),
            ("PUT".into(), "/state".into(), 20)
        );
        for (bad, code) in [
            (&b"GET /state"[..], 400),
            (b"get /state HTTP/1.1", 400),
            (b"GET state HTTP/1.1", 400),
            (b"GET /state SPDY/3", 400),
            (b"GET /state HTTP/1.1\r\nContent-Length: -1", 400),
            (b"GET /state HTTP/1.1\r\nContent-Length: 99999", 413),
            (b"GET /state HTTP/1.1\r\nTransfer-Encoding: chunked", 400),
            (b"GET /state HTTP/1.1\r\nno colon", 400),
            (b"\xff\xfe", 400),
        ] {
            assert_eq!(parse_head(bad).unwrap_err().code, code, "{bad:?}");
        }
    }

    #[test]
    fn a_request_is_whole_only_with_its_body_and_within_the_limits() {
        assert_eq!(parse_request(b"GET /state HTTP/1.1\r\n").unwrap(), None);
        let put = b"PUT /state HTTP/1.1\r\nContent-Length: 4\r\n\r\n{\"a";
        assert_eq!(parse_request(put).unwrap(), None);
        let whole = b"PUT /state HTTP/1.1\r\nContent-Length: 4\r\n\r\n{\"a\"}";
        let r = parse_request(whole).unwrap().unwrap();
        assert_eq!((r.method.as_str(), r.path.as_str()), ("PUT", "/state"));
        assert_eq!(r.body, b"{\"a\"");
        let long = vec![b'x'; MAX_HEAD + 1];
        assert_eq!(parse_request(&long).unwrap_err().code, 413);
    }

    #[test]
    fn an_answer_says_its_length_and_closes() {
        let mut out = Vec::new();
        respond(&mut out, &err(404, "no resource /x"));
        let t = String::from_utf8(out).unwrap();
        let (head, body) = t.split_once("\r\n\r\n").unwrap();
        assert!(head.starts_with("HTTP/1.1 404 Not Found\r\n"), "{head}");
        assert!(
            head.contains(&format!("Content-Length: {}", body.len())),
            "{t}"
        );
        assert!(head.contains("Connection: close"), "{head}");
        assert_eq!(
            serde_json::from_str::<Value>(body).unwrap()["error"],
            "no resource /x"
        );
    }
}
