use super::*;

#[test]
fn a_quoted_value_is_cut_to_a_hundred_characters() {
    assert_eq!(quoted(b"not-a-number"), "not-a-number");
    let long = "x".repeat(500);
    assert_eq!(quoted(long.as_bytes()), format!("{}…", "x".repeat(100)));
}
