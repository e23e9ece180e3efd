//! Reading what a `/metrics` endpoint serves, in the Prometheus text
//! format, as PromQL would: samples by name and labels, in any order.

/// The sum of the samples of `name` in Prometheus text whose labels include
/// every pair of `labels` (in any order, among any others), as PromQL's
/// `sum(name{labels})` would read it; `None` when no sample matches.
pub fn metric(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let matching: Vec<f64> = samples(text)
        .filter(|sample| sample.name == name)
        .filter(|sample| {
            labels
                .iter()
                .all(|(k, v)| sample.labels.iter().any(|(sk, sv)| sk == k && sv == v))
        })
        .map(|sample| sample.value)
        .collect();
    (!matching.is_empty()).then(|| matching.iter().sum())
}

/// One line of the Prometheus text format: `name{k="v",...} value`.
#[derive(Debug)]
pub struct Sample {
    /// The metric's name (`idem_requests_total`, `..._bucket`).
    pub name: String,
    /// The labels, values unescaped, in the order served.
    pub labels: Vec<(String, String)>,
    /// The sample's value.
    pub value: f64,
}

/// The samples in Prometheus text (comments skipped). Panics on a line that
/// is not a sample: what `/metrics` serves must parse.
pub fn samples(text: &str) -> impl Iterator<Item = Sample> + '_ {
    text.lines()
        .map(str::trim)
        .filter(|line| !line.is_empty() && !line.starts_with('#'))
        .map(|line| parse_sample(line).unwrap_or_else(|| panic!("not a sample: {line:?}")))
}

fn parse_sample(line: &str) -> Option<Sample> {
    let name_end = line.find(['{', ' '])?;
    let name = line[..name_end].to_owned();
    let mut labels = Vec::new();
    let mut rest = &line[name_end..];
    if let Some(mut inner) = rest.strip_prefix('{') {
        // `key="value"` pairs, separated by commas, up to the closing `}`.
        loop {
            inner = inner.trim_start_matches([',', ' ']);
            if let Some(tail) = inner.strip_prefix('}') {
                rest = tail;
                break;
            }
            let (key, after_key) = inner.split_once("=\"")?;
            let mut value = String::new();
            let mut chars = after_key.char_indices();
            let close = loop {
                match chars.next()? {
                    (at, '"') => break at,
                    (_, '\\') => match chars.next()?.1 {
                        'n' => value.push('\n'),
                        other => value.push(other),
                    },
                    (_, other) => value.push(other),
                }
            };
            labels.push((key.trim().to_owned(), value));
            inner = &after_key[close + 1..];
        }
    }
    let value = rest.split_whitespace().next()?.parse().ok()?;
    Some(Sample {
        name,
        labels,
        value,
    })
}
