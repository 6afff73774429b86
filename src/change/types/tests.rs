//! Unit tests of source type mapping and text-format parsing: decimals, numeric typmods,
//! timestamps, arrays, bytea.

use super::*;

#[test]
fn decimals_are_exact() {
    assert_eq!(parse_decimal("12.34", 10, 2, true).unwrap(), 1234);
    assert_eq!(parse_decimal("-0.5", 10, 2, true).unwrap(), -50);
    assert_eq!(parse_decimal("7", 10, 2, true).unwrap(), 700);
    assert_eq!(parse_decimal("1.2300", 10, 2, true).unwrap(), 123);
    assert!(parse_decimal("1.234", 10, 2, true).is_err());
    assert!(parse_decimal("123456789", 10, 2, true).is_err());
    assert!(parse_decimal("NaN", 10, 2, true).is_err());
    let err = parse_decimal("0.1234567890123456789", 38, 18, false).unwrap_err();
    assert!(err.0.contains("numeric(p,s)"));
}

#[test]
fn numeric_typmods() {
    // numeric(10,2)
    assert_eq!(
        numeric_from_typmod(((10 << 16) | 2) + 4),
        PgType::Numeric {
            precision: 10,
            scale: 2,
            constrained: true
        }
    );
    assert!(matches!(
        numeric_from_typmod(-1),
        PgType::Numeric {
            constrained: false,
            ..
        }
    ));
}

#[test]
fn timestamps() {
    assert_eq!(
        parse_timestamp("1970-01-01 00:00:01", false).unwrap(),
        1_000_000
    );
    assert_eq!(parse_timestamp("1970-01-01 01:00:00+01", true).unwrap(), 0);
    assert_eq!(
        parse_timestamp("1969-12-31 23:59:59.5", false).unwrap(),
        -500_000
    );
    assert_eq!(
        parse_timestamp("2000-01-01 00:00:00.123456+00", true).unwrap(),
        946_684_800_123_456
    );
    assert!(parse_timestamp("infinity", false)
        .unwrap_err()
        .0
        .contains("no Iceberg"));
    assert_eq!(parse_date("1970-01-02").unwrap(), 1);
    assert_eq!(
        parse_date("0001-01-01 BC").unwrap(),
        parse_date("0000-01-01").unwrap()
    );
    assert_eq!(parse_time("00:00:01.5").unwrap(), 1_500_000);
}

#[test]
fn arrays() {
    let mut out = Vec::new();
    let n = parse_array(r#"{1,NULL,"a,b","x\"y",""}"#, |e| {
        out.push(e.map(str::to_string));
        Ok(())
    })
    .unwrap();
    assert_eq!(n, 5);
    assert_eq!(out[1], None);
    assert_eq!(out[2].as_deref(), Some("a,b"));
    assert_eq!(out[3].as_deref(), Some("x\"y"));
    assert_eq!(out[4].as_deref(), Some(""));
    assert_eq!(parse_array("{}", |_| Ok(())).unwrap(), 0);
    assert!(parse_array("{{1},{2}}", |_| Ok(())).is_err());
}

#[test]
fn bytea_hex() {
    assert_eq!(parse_bytea("\\x00ff").unwrap(), vec![0, 255]);
    assert!(parse_bytea("abc").is_err());
}
