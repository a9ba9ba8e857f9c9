//! The text form of ids: fixed-width Crockford base32, so that sorting the
//! strings (bytewise, as most databases and `sort` do) sorts the ids.
//!
//! An id of a layout of `total_bits` bits (see
//! [`Layout::total_bits`](crate::Layout::total_bits)) is written as exactly
//! [`width`]`(total_bits) = ceil(total_bits / 5)` digits of the alphabet
//! [`ALPHABET`], most significant first and padded with leading `0`s: 13
//! characters for the 63-bit layouts, 11 for a 53-bit (JavaScript-safe) one.
//! Because every text of one width has the same length and the alphabet is in
//! ASCII order, `a < b` exactly when `encode(a) < encode(b)`.
//!
//! [`encode`] writes upper case. [`decode`] follows Douglas Crockford's base32
//! (<https://www.crockford.com/base32.html>): it ignores case and reads the
//! look-alikes `I` and `L` as `1` and `O` as `0`. It accepts no hyphens and
//! no check symbol: the width is fixed, so a text is exactly [`width`]
//! characters of the alphabet or of those three look-alikes.

use thiserror::Error;

/// The 32 digits, in value order: Crockford's base32 alphabet (digits and
/// upper-case letters without `I`, `L`, `O` and `U`). Its bytes ascend, so
/// texts of one width sort like the values they encode.
pub const ALPHABET: &[u8; 32] = b"0123456789ABCDEFGHJKMNPQRSTVWXYZ";

/// Bits one character carries.
const BITS_PER_CHAR: u8 = 5;

/// The number of characters of every id text of a `total_bits`-bit layout:
/// `ceil(total_bits / 5)` (13 for 63 bits, 11 for 53).
pub const fn width(total_bits: u8) -> usize {
    total_bits.div_ceil(BITS_PER_CHAR) as usize
}

/// Why a text is not an id of the layout.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum TextIdError {
    /// The text is not exactly [`width`] characters long.
    #[error("id text {text:?} has {got} characters; ids of a {total_bits}-bit layout are exactly {expected} Crockford base32 characters")]
    WrongLength {
        /// The text given.
        text: String,
        /// Its length in characters.
        got: usize,
        /// The width of the layout's texts.
        expected: usize,
        /// The layout's total bits.
        total_bits: u8,
    },
    /// A character that is neither in [`ALPHABET`] (either case) nor one of
    /// the look-alikes `I`, `L` and `O`.
    #[error("id text {text:?} has {character:?} at position {position}, which is not a Crockford base32 digit (0-9 and A-Z except U; I and L read as 1, O as 0)")]
    BadCharacter {
        /// The text given.
        text: String,
        /// The first character that is not a digit.
        character: char,
        /// Its 1-based position, in characters.
        position: usize,
    },
    /// Digits whose value does not fit the layout: at least `2^total_bits`.
    #[error("id text {text:?} is {value_hint} or more, above the largest id {max} of a {total_bits}-bit layout (largest text {max_text})", value_hint = 1u128 << *total_bits, max = max_id(*total_bits), max_text = encode(max_id(*total_bits), *total_bits))]
    OutOfRange {
        /// The text given.
        text: String,
        /// The layout's total bits.
        total_bits: u8,
    },
}

/// `2^total_bits - 1`, saturating at `u64::MAX` for 64 bits.
fn max_id(total_bits: u8) -> u64 {
    u64::MAX >> (64 - u32::from(total_bits.clamp(1, 64)))
}

/// The text of `id` under a `total_bits`-bit layout: [`width`]`(total_bits)`
/// upper-case Crockford base32 digits, zero-padded (`0` is
/// `"0000000000000"` and `2^63 - 1` is `"7ZZZZZZZZZZZZ"` for 63 bits).
///
/// Bits of `id` at or above `total_bits` do not fit the width; callers pass
/// ids of the layout, which are below `2^total_bits` (checked in debug
/// builds). `total_bits` is at most 64.
pub fn encode(id: u64, total_bits: u8) -> String {
    debug_assert!(total_bits <= 64);
    debug_assert!(
        id <= max_id(total_bits),
        "id {id} has more than {total_bits} bits"
    );
    let n = width(total_bits);
    (0..n)
        .rev()
        .map(|i| {
            let shift = u32::try_from(i).unwrap_or(u32::MAX) * u32::from(BITS_PER_CHAR);
            let digit = id.checked_shr(shift).unwrap_or(0) & 0x1f;
            char::from(ALPHABET[digit as usize])
        })
        .collect()
}

/// The value of one character: a digit of [`ALPHABET`] in either case, or a
/// look-alike (`I`, `L` = 1, `O` = 0); `None` for anything else.
fn digit_value(c: char) -> Option<u64> {
    let upper = match c.to_ascii_uppercase() {
        'I' | 'L' => '1',
        'O' => '0',
        other => other,
    };
    let byte = u8::try_from(upper).ok()?;
    ALPHABET.iter().position(|&d| d == byte).map(|p| p as u64)
}

/// The id `text` stands for under a `total_bits`-bit layout: the inverse of
/// [`encode`], ignoring case and reading `I`/`L` as `1` and `O` as `0`
/// (Crockford's rule). Errors, in this order, when the text is not exactly
/// [`width`] characters ([`TextIdError::WrongLength`]), when a character is
/// not a digit ([`TextIdError::BadCharacter`], naming the first such
/// character and its 1-based position), or when its value is `2^total_bits`
/// or more ([`TextIdError::OutOfRange`]). `total_bits` is at most 64.
pub fn decode(text: &str, total_bits: u8) -> Result<u64, TextIdError> {
    let expected = width(total_bits);
    let got = text.chars().count();
    if got != expected {
        return Err(TextIdError::WrongLength {
            text: text.to_owned(),
            got,
            expected,
            total_bits,
        });
    }
    let mut value: u128 = 0;
    for (i, c) in text.chars().enumerate() {
        let d = digit_value(c).ok_or_else(|| TextIdError::BadCharacter {
            text: text.to_owned(),
            character: c,
            position: i + 1,
        })?;
        value = (value << BITS_PER_CHAR) | u128::from(d);
    }
    if value >> total_bits != 0 {
        return Err(TextIdError::OutOfRange {
            text: text.to_owned(),
            total_bits,
        });
    }
    // Below 2^total_bits <= 2^64: it fits.
    u64::try_from(value).map_err(|_| TextIdError::OutOfRange {
        text: text.to_owned(),
        total_bits,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const MAX_63: u64 = (1 << 63) - 1;
    const MAX_53: u64 = (1 << 53) - 1;

    #[test]
    fn widths_are_the_ceiling_of_a_fifth_of_the_bits() {
        assert_eq!(width(63), 13);
        assert_eq!(width(53), 11);
        assert_eq!(width(32), 7);
        assert_eq!(width(60), 12);
        assert_eq!(width(64), 13);
    }

    #[test]
    fn exact_texts_of_63_bit_ids() {
        assert_eq!(encode(0, 63), "0000000000000");
        assert_eq!(encode(1, 63), "0000000000001");
        assert_eq!(encode(31, 63), "000000000000Z");
        assert_eq!(encode(32, 63), "0000000000010");
        assert_eq!(encode(MAX_63, 63), "7ZZZZZZZZZZZZ");
        // The default layout's id of ms 1000, machine id 5, sequence 5.
        assert_eq!(encode(4_194_309_125, 63), "0000003X00505");
        assert_eq!(decode("0000003x00505", 63), Ok(4_194_309_125));
        assert_eq!(decode("7ZZZZZZZZZZZZ", 63), Ok(MAX_63));
        assert_eq!(decode("0000000000000", 63), Ok(0));
    }

    #[test]
    fn exact_texts_of_53_bit_ids() {
        assert_eq!(encode(0, 53), "00000000000");
        assert_eq!(encode(MAX_53, 53), "7ZZZZZZZZZZ");
        assert_eq!(decode("7ZZZZZZZZZZ", 53), Ok(MAX_53));
        assert_eq!(encode(1 << 52, 53), "40000000000");
    }

    #[test]
    fn decoding_ignores_case_and_reads_look_alikes() {
        assert_eq!(decode("7zzzzzzzzzzzz", 63), Ok(MAX_63));
        assert_eq!(decode("000000000000a", 63), Ok(10));
        assert_eq!(decode("000000000000I", 63), Ok(1));
        assert_eq!(decode("000000000000i", 63), Ok(1));
        assert_eq!(decode("000000000000L", 63), Ok(1));
        assert_eq!(decode("000000000000l", 63), Ok(1));
        assert_eq!(decode("OOOOOOOOOOOO1", 63), Ok(1));
        assert_eq!(decode("oooooooooooo1", 63), Ok(1));
    }

    #[test]
    fn a_wrong_length_is_refused_naming_the_width() {
        let e = decode("000000000000", 63).unwrap_err();
        assert_eq!(
            e,
            TextIdError::WrongLength {
                text: "000000000000".into(),
                got: 12,
                expected: 13,
                total_bits: 63
            }
        );
        assert_eq!(
            e.to_string(),
            "id text \"000000000000\" has 12 characters; ids of a 63-bit layout are exactly 13 \
             Crockford base32 characters"
        );
        assert!(matches!(
            decode("0000000000000", 53),
            Err(TextIdError::WrongLength {
                got: 13,
                expected: 11,
                ..
            })
        ));
        assert!(matches!(
            decode("", 63),
            Err(TextIdError::WrongLength { got: 0, .. })
        ));
    }

    #[test]
    fn a_bad_character_is_refused_naming_it_and_its_position() {
        let e = decode("00000U0000000", 63).unwrap_err();
        assert_eq!(
            e,
            TextIdError::BadCharacter {
                text: "00000U0000000".into(),
                character: 'U',
                position: 6
            }
        );
        assert_eq!(
            e.to_string(),
            "id text \"00000U0000000\" has 'U' at position 6, which is not a Crockford base32 \
             digit (0-9 and A-Z except U; I and L read as 1, O as 0)"
        );
        for (text, character, position) in [
            ("-000000000000", '-', 1),
            ("000000000000u", 'u', 13),
            ("0000 00000000", ' ', 5),
            ("000000000000é", 'é', 13),
            ("0*00000000*00", '*', 2),
        ] {
            assert_eq!(
                decode(text, 63),
                Err(TextIdError::BadCharacter {
                    text: text.into(),
                    character,
                    position
                }),
                "{text}"
            );
        }
    }

    #[test]
    fn a_value_of_the_layouts_bits_or_more_is_refused() {
        let e = decode("8000000000000", 63).unwrap_err();
        assert_eq!(
            e,
            TextIdError::OutOfRange {
                text: "8000000000000".into(),
                total_bits: 63
            }
        );
        assert_eq!(
            e.to_string(),
            "id text \"8000000000000\" is 9223372036854775808 or more, above the largest id \
             9223372036854775807 of a 63-bit layout (largest text 7ZZZZZZZZZZZZ)"
        );
        assert!(matches!(
            decode("ZZZZZZZZZZZZZ", 63),
            Err(TextIdError::OutOfRange { .. })
        ));
        assert!(matches!(
            decode("80000000000", 53),
            Err(TextIdError::OutOfRange { total_bits: 53, .. })
        ));
    }

    proptest! {
        #[test]
        fn text_id_round_trips_63_bits(id in 0..=MAX_63) {
            let text = encode(id, 63);
            prop_assert_eq!(text.len(), 13);
            prop_assert_eq!(decode(&text, 63), Ok(id));
            prop_assert_eq!(decode(&text.to_ascii_lowercase(), 63), Ok(id));
        }

        #[test]
        fn text_id_round_trips_53_bits(id in 0..=MAX_53) {
            let text = encode(id, 53);
            prop_assert_eq!(text.len(), 11);
            prop_assert_eq!(decode(&text, 53), Ok(id));
        }

        #[test]
        fn text_id_sorts_like_the_id_63_bits(a in 0..=MAX_63, b in 0..=MAX_63) {
            prop_assert_eq!(a.cmp(&b), encode(a, 63).cmp(&encode(b, 63)));
        }

        #[test]
        fn text_id_sorts_like_the_id_53_bits(a in 0..=MAX_53, b in 0..=MAX_53) {
            prop_assert_eq!(a.cmp(&b), encode(a, 53).cmp(&encode(b, 53)));
        }

        /// Ids close to each other (same ms, neighbouring sequences), where
        /// an ordering slip would show.
        #[test]
        fn text_id_sorts_like_the_id_for_neighbours(a in 0..=MAX_63 - 64, d in 0u64..64) {
            let b = a + d;
            prop_assert_eq!(a.cmp(&b), encode(a, 63).cmp(&encode(b, 63)));
        }

        #[test]
        fn text_id_every_bits_from_32_to_63_round_trips(bits in 32u8..=63, raw in any::<u64>()) {
            let id = raw & max_id(bits);
            let text = encode(id, bits);
            prop_assert_eq!(text.len(), width(bits));
            prop_assert_eq!(decode(&text, bits), Ok(id));
        }
    }
}
