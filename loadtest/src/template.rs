//! Request templating in ghz's syntax, so a request can differ per call:
//! `{{.RequestNumber}}`, `{{.FullyQualifiedName}}`, `{{.MethodName}}`,
//! `{{.ServiceName}}`, `{{.InputName}}`, `{{.OutputName}}`, `{{.Timestamp}}`
//! (RFC 3339), `{{.TimestampUnix}}` (s), `{{.TimestampUnixMilli}}` (ms),
//! `{{.UUID}}` and `{{newUUID}}` (a v4 UUID), `{{randomInt MIN MAX}}`
//! (MIN ≤ n < MAX) and `{{randomString N}}` (N letters and digits).
//!
//! The template is parsed once; rendering only fills the holes. It is a small
//! subset of Go's text/template, not an engine: anything else between `{{`
//! and `}}` is an error at parse time, never a silent literal.

use std::fmt::Write as _;

use anyhow::{bail, Context};
use rand::Rng;

/// What a template can refer to besides the per-call values.
#[derive(Debug, Clone, Default)]
pub struct CallInfo {
    /// `package.Service.Method`.
    pub fully_qualified_name: String,
    /// `Method`.
    pub method_name: String,
    /// `package.Service`.
    pub service_name: String,
    /// The request message's full name.
    pub input_name: String,
    /// The response message's full name.
    pub output_name: String,
}

#[derive(Debug, Clone, PartialEq)]
enum Part {
    Text(String),
    RequestNumber,
    Static(String),
    Timestamp,
    TimestampUnix,
    TimestampUnixMilli,
    Uuid,
    RandomInt(i64, i64),
    RandomString(usize),
}

/// A parsed template.
#[derive(Debug, Clone, PartialEq)]
pub struct Template {
    parts: Vec<Part>,
}

impl Template {
    /// Parses `text`; fails on an unknown action or an unclosed `{{`.
    pub fn parse(text: &str, info: &CallInfo) -> anyhow::Result<Self> {
        let mut parts = Vec::new();
        let mut rest = text;
        while let Some(open) = rest.find("{{") {
            if open > 0 {
                parts.push(Part::Text(rest[..open].to_owned()));
            }
            let after = &rest[open + 2..];
            let close = after.find("}}").with_context(|| {
                format!(
                    "unclosed '{{{{' in the request template at {:?}",
                    &rest[open..]
                )
            })?;
            parts.push(action(after[..close].trim(), info)?);
            rest = &after[close + 2..];
        }
        if !rest.is_empty() {
            parts.push(Part::Text(rest.to_owned()));
        }
        Ok(Self { parts })
    }

    /// True when every call renders the same text.
    pub fn is_static(&self) -> bool {
        self.parts
            .iter()
            .all(|p| matches!(p, Part::Text(_) | Part::Static(_)))
    }

    /// Renders the template for call number `request_number` (0-based).
    pub fn render(&self, request_number: u64, rng: &mut impl Rng) -> String {
        let mut out = String::new();
        for part in &self.parts {
            match part {
                Part::Text(t) | Part::Static(t) => out.push_str(t),
                Part::RequestNumber => {
                    let _ = write!(out, "{request_number}");
                }
                Part::Timestamp => out.push_str(
                    &humantime::format_rfc3339_millis(std::time::UNIX_EPOCH + unix()).to_string(),
                ),
                Part::TimestampUnix => {
                    let _ = write!(out, "{}", unix().as_secs());
                }
                Part::TimestampUnixMilli => {
                    let _ = write!(out, "{}", unix().as_millis());
                }
                Part::Uuid => {
                    let _ = write!(
                        out,
                        "{}",
                        uuid::Builder::from_random_bytes(rng.random()).into_uuid()
                    );
                }
                Part::RandomInt(min, max) => {
                    let _ = write!(out, "{}", rng.random_range(*min..*max));
                }
                Part::RandomString(n) => {
                    out.extend((0..*n).map(|_| rng.sample(rand::distr::Alphanumeric) as char))
                }
            }
        }
        out
    }
}

#[allow(clippy::disallowed_methods)] // a template value, not the generator's clock
fn unix() -> std::time::Duration {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
}

fn action(a: &str, info: &CallInfo) -> anyhow::Result<Part> {
    let words: Vec<&str> = a.split_whitespace().collect();
    Ok(match words.as_slice() {
        [".RequestNumber"] => Part::RequestNumber,
        [".FullyQualifiedName"] => Part::Static(info.fully_qualified_name.clone()),
        [".MethodName"] => Part::Static(info.method_name.clone()),
        [".ServiceName"] => Part::Static(info.service_name.clone()),
        [".InputName"] => Part::Static(info.input_name.clone()),
        [".OutputName"] => Part::Static(info.output_name.clone()),
        [".Timestamp"] => Part::Timestamp,
        [".TimestampUnix"] => Part::TimestampUnix,
        [".TimestampUnixMilli"] => Part::TimestampUnixMilli,
        [".UUID"] | ["newUUID"] => Part::Uuid,
        ["randomInt", min, max] => {
            let (min, max): (i64, i64) = (min.parse()?, max.parse()?);
            if min >= max {
                bail!("randomInt {min} {max}: MIN must be below MAX");
            }
            Part::RandomInt(min, max)
        }
        ["randomString", n] => Part::RandomString(n.parse()?),
        _ => bail!(
            "unknown template action {{{{{a}}}}}: use .RequestNumber, .FullyQualifiedName, .MethodName, .ServiceName, .InputName, .OutputName, .Timestamp, .TimestampUnix, .TimestampUnixMilli, .UUID, newUUID, randomInt MIN MAX or randomString N"
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    fn info() -> CallInfo {
        CallInfo {
            fully_qualified_name: "snowkeep.v1.IdService.NextIds".into(),
            method_name: "NextIds".into(),
            service_name: "snowkeep.v1.IdService".into(),
            input_name: "snowkeep.v1.NextIdsRequest".into(),
            output_name: "snowkeep.v1.NextIdsResponse".into(),
        }
    }

    #[test]
    fn fills_request_numbers_and_names() {
        let t = Template::parse(
            r#"{"count": {{.RequestNumber}}, "m": "{{ .MethodName }}"}"#,
            &info(),
        )
        .unwrap();
        let mut rng = rand::rngs::StdRng::seed_from_u64(1);
        assert_eq!(t.render(7, &mut rng), r#"{"count": 7, "m": "NextIds"}"#);
        assert!(!t.is_static());
    }

    #[test]
    fn random_values_stay_in_range_and_uuids_are_well_formed() {
        let t =
            Template::parse("{{randomInt 5 8}}|{{randomString 6}}|{{newUUID}}", &info()).unwrap();
        let mut rng = rand::rngs::StdRng::seed_from_u64(2);
        for i in 0..100 {
            let out = t.render(i, &mut rng);
            let parts: Vec<&str> = out.split('|').collect();
            let n: i64 = parts[0].parse().unwrap();
            assert!((5..8).contains(&n), "{n}");
            assert_eq!(parts[1].len(), 6);
            assert!(parts[1].chars().all(|c| c.is_ascii_alphanumeric()));
            assert_eq!(
                uuid::Uuid::parse_str(parts[2]).unwrap().get_version_num(),
                4
            );
        }
    }

    #[test]
    fn plain_text_is_static_and_unknown_actions_fail() {
        let t = Template::parse(r#"{"count": 1}"#, &info()).unwrap();
        assert!(t.is_static());
        let err = Template::parse("{{.Nope}}", &info())
            .unwrap_err()
            .to_string();
        assert!(err.contains("unknown template action {{.Nope}}"), "{err}");
        let err = Template::parse("{{.RequestNumber", &info())
            .unwrap_err()
            .to_string();
        assert!(err.contains("unclosed"), "{err}");
        let err = Template::parse("{{randomInt 9 3}}", &info())
            .unwrap_err()
            .to_string();
        assert!(err.contains("MIN must be below MAX"), "{err}");
    }
}
