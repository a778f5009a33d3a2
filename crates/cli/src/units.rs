//! Sizes as users type them (`64M`, `1G`, `2048`) and as the tools print them.

const SUFFIXES: [(char, u32); 4] = [('K', 10), ('M', 20), ('G', 30), ('T', 40)];

/// Parse a byte count: a whole number with an optional binary suffix K, M, G or T
/// (case-insensitive, optionally followed by `B` or `iB`): `512`, `64M`, `1GiB`.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let t = t.strip_suffix("iB").or_else(|| t.strip_suffix('B')).unwrap_or(t);
    let (digits, shift) = match t.chars().last().map(|c| c.to_ascii_uppercase()) {
        Some(c) if c.is_ascii_alphabetic() => {
            let shift = SUFFIXES.iter().find(|(s, _)| *s == c).map(|(_, sh)| *sh);
            (&t[..t.len() - 1], shift.ok_or_else(|| format!("unknown size suffix in '{text}' (use K, M, G or T)"))?)
        }
        _ => (t, 0),
    };
    let n: u64 = digits.parse().map_err(|_| format!("'{text}' is not a size (examples: 4096, 64M, 1G)"))?;
    n.checked_mul(1 << shift).ok_or_else(|| format!("size '{text}' is too large"))
}

/// `1.0 GiB`, `64.0 MiB`, `512 B`.
pub fn human_bytes(n: u64) -> String {
    match SUFFIXES.iter().rev().find(|(_, shift)| n >= 1 << shift) {
        Some((s, shift)) => format!("{:.1} {s}iB", n as f64 / (1u64 << shift) as f64),
        None => format!("{n} B"),
    }
}

/// `1,234,567`: counts and rates read at a glance.
pub fn grouped(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// `2026-11-22 05:10:09 UTC` for seconds since the epoch (proleptic Gregorian calendar).
pub fn utc_time(secs: i64) -> String {
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let (y, m, d) = civil_from_days(days);
    format!("{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02} UTC", rem / 3600, rem / 60 % 60, rem % 60)
}

/// Howard Hinnant's days-to-civil algorithm.
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_with_and_without_suffixes() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("64M"), Ok(64 << 20));
        assert_eq!(parse_size("1g"), Ok(1 << 30));
        assert_eq!(parse_size("2GiB"), Ok(2 << 30));
        assert_eq!(parse_size("8KB"), Ok(8 << 10));
        assert_eq!(parse_size("1T"), Ok(1 << 40));
    }

    #[test]
    fn bad_sizes_are_errors() {
        assert!(parse_size("").is_err());
        assert!(parse_size("12Q").is_err());
        assert!(parse_size("-1M").is_err());
        assert!(parse_size("99999999999T").is_err());
        assert!(parse_size("M").is_err());
    }

    #[test]
    fn printing() {
        assert_eq!(human_bytes(512), "512 B");
        assert_eq!(human_bytes(64 << 20), "64.0 MiB");
        assert_eq!(grouped(1234567), "1,234,567");
        assert_eq!(grouped(999), "999");
        assert_eq!(utc_time(0), "1970-01-01 00:00:00 UTC");
        assert_eq!(utc_time(1_795_324_209), "2026-11-22 05:10:09 UTC");
    }
}
