//! Telling a fence key that was never written from one that was deleted.
//!
//! A machine id without a fence key is either never used, or its key was
//! deleted (by an operator, a script, a partial copy) from under a holder
//! that may still be stamping up to its fence. Only the second needs a claim
//! to start ahead of its clock, and with fences far ahead of the clock (an
//! outage budget) that wait is long. So snowkeep counts the fence keys it
//! creates, in blocks of 64 machine ids.
//!
//! **The count.** Snowkeep never deletes a fence key, and creates one only in
//! the claim transaction that takes a machine id without one (a holder that
//! finds its own key deleted and writes it again, with its own fence, puts
//! back what the deletion took: that pairs with the deletion). That
//! transaction also puts a *creation marker*, `fence-count/BBBB/NONCE` with
//! an empty value, named by 64 random bits, so concurrent first claims never
//! contend for one key, and deleting "every key of a machine id" leaves the
//! marker. A block's count is its `base` (0 unless re-based, below) plus its
//! markers. While nobody else touches fence keys, the fence keys present in a
//! block equal its count. When they do, no fence key of the block was ever
//! deleted, so a missing one was never written: its claim starts at the
//! namespace floor (or the block's `absent_floor_ms`, if higher), with no
//! wait.
//!
//! The `base` and `absent_floor_ms` come from the block's own key,
//! `fence-count/BBBB`, once it was re-based, else from the namespace's root
//! `fence-count` (`base 0`, `absent_floor_ms 0`), which the namespace
//! creation writes when nothing at all is stored under the namespace yet.
//!
//! **Checked twice.** The pool read predicts the floor; the claim
//! transaction, after creating the key and its marker, counts the block's
//! fence keys and markers again at its own revision. When they still agree,
//! no fence key of the block was deleted up to the claim, so this machine id
//! was not written and deleted in between either. When they no longer agree,
//! a second transaction raises the new fence key to the conservative floor
//! and the claim takes that floor.
//!
//! **When the count does not vouch** (no root or block key: a namespace of
//! an older version, or deleted; unreadable; more fence keys than counted,
//! made by something other than a claim; fewer, so some were deleted; or a
//! held machine id of the block without its fence key), the claim of a
//! missing key takes the conservative floor its caller gives (its clock plus
//! how far ahead any live holder may stamp), and logs why. Its transaction
//! then **re-bases** the block: the block's key gets a `base` that makes the
//! count equal the keys present, and `absent_floor_ms` = that conservative
//! floor, below which no later claim of a missing key in the block starts.
//! That is safe because a holder whose fence key was deleted can no longer
//! raise it (fence writes are guarded by the key's revision), so it stamps
//! at most what it persisted before: its clock at that write plus the lead,
//! below the re-base's floor as far as clocks agree (the same assumption as
//! the conservative floor itself). A held machine id without its fence key
//! blocks the re-base: its holder (an embedded client, say) may stamp far
//! ahead until its lease ends.

use snowkeep_client::Millis;

/// The `base` and `absent_floor_ms` of a block, from its own key or the
/// namespace's root.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CountBase {
    /// Added to the block's markers to give its count of fence keys created.
    pub base: i64,
    /// The floor (layout ms) below which no claim of a missing fence key of
    /// the block starts: the conservative floor of its last re-base, 0 when
    /// it was counted since the namespace was created.
    pub absent_floor: Millis,
}

impl CountBase {
    /// The root of a namespace counted since its creation.
    pub const NEW: CountBase = CountBase {
        base: 0,
        absent_floor: Millis(0),
    };

    /// The stored value, `base B\nabsent_floor_ms F\n`.
    pub fn encode(&self) -> String {
        format!(
            "base {}\nabsent_floor_ms {}\n",
            self.base,
            self.absent_floor.get()
        )
    }

    /// Parses a stored value: a `base` line (an integer) and an
    /// `absent_floor_ms` line (a whole number), in any order; `None` for
    /// anything else.
    pub fn parse(value: &[u8]) -> Option<Self> {
        let (mut base, mut absent_floor) = (None, None);
        for line in std::str::from_utf8(value).ok()?.lines() {
            let line = line.trim();
            if line.is_empty() {
                continue;
            }
            match line.split_once(' ')? {
                ("base", n) => base = Some(n.trim().parse().ok()?),
                ("absent_floor_ms", n) => absent_floor = Some(Millis(n.trim().parse().ok()?)),
                _ => return None,
            }
        }
        Some(Self {
            base: base?,
            absent_floor: absent_floor?,
        })
    }
}

/// A root or block key as read.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Counter {
    /// No key.
    #[default]
    Absent,
    /// A value that does not parse (quoted).
    Unreadable(String),
    /// A readable key.
    Read(CountBase),
}

impl Counter {
    /// Decodes a key's value, `None` meaning no key.
    pub fn decode(value: Option<&[u8]>) -> Self {
        match value {
            None => Counter::Absent,
            Some(v) => CountBase::parse(v)
                .map(Counter::Read)
                .unwrap_or_else(|| Counter::Unreadable(super::keys::quoted(v))),
        }
    }

    /// The block's key if it has one, else the namespace's root.
    pub fn or<'a>(&'a self, root: &'a Counter) -> &'a Counter {
        match self {
            Counter::Absent => root,
            own => own,
        }
    }
}

/// One block of a pool read, everything at the read's revision.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Block {
    /// The block's own key.
    pub own: Counter,
    /// Its mod revision (0: absent): the guard of a re-base.
    pub own_revision: i64,
    /// Creation markers.
    pub markers: u64,
    /// Fence keys present, readable or not.
    pub present: u64,
    /// Held machine ids (by a server or an embedded requester) without a
    /// fence key.
    pub held_without_fence: u64,
}

/// Why a block's count does not vouch that its missing fence keys were
/// never written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Distrust {
    /// Neither the block nor the namespace has a count key: a namespace from
    /// a version before the counts, or the key was deleted.
    Absent,
    /// The count key does not parse.
    Unreadable,
    /// Fewer fence keys than counted: some were deleted.
    Deleted {
        /// Fence keys counted as created.
        counted: i64,
        /// Fence keys present.
        present: u64,
    },
    /// More fence keys than counted: something other than a claim (an older
    /// version, a hand-written key) created some, so a deletion may hide
    /// behind them.
    Uncounted {
        /// Fence keys counted as created.
        counted: i64,
        /// Fence keys present.
        present: u64,
    },
    /// Counts agree, but a held machine id has no fence key: it was deleted
    /// under its holder, or an older version has not written it yet.
    HeldWithoutFence {
        /// Held machine ids of the block without a fence key.
        held: u64,
    },
}

impl std::fmt::Display for Distrust {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Distrust::Absent => write!(f, "the block has no fence count (a namespace from an older version, or the key was deleted)"),
            Distrust::Unreadable => write!(f, "the block's fence count is unreadable"),
            Distrust::Deleted { counted, present } => write!(f, "{counted} fence keys were created in the block but only {present} are left: fence keys were deleted"),
            Distrust::Uncounted { counted, present } => write!(f, "the block has {present} fence keys but only {counted} were counted: something other than a snowkeep claim created fence keys"),
            Distrust::HeldWithoutFence { held } => write!(f, "{held} held machine id(s) of the block have no fence key"),
        }
    }
}

/// Whether `count` (the block's key or the root, as [`Counter::or`] picks)
/// with `markers` creation markers vouches for a block of `present` fence
/// keys: `None` when it does, else why not. Held machine ids without a fence
/// key are not looked at here.
pub fn vouches(count: &Counter, markers: u64, present: u64) -> Option<Distrust> {
    let base = match count {
        Counter::Absent => return Some(Distrust::Absent),
        Counter::Unreadable(_) => return Some(Distrust::Unreadable),
        Counter::Read(c) => c,
    };
    let counted = base
        .base
        .saturating_add(i64::try_from(markers).unwrap_or(i64::MAX));
    let have = i64::try_from(present).unwrap_or(i64::MAX);
    match have.cmp(&counted) {
        std::cmp::Ordering::Equal => None,
        std::cmp::Ordering::Less => Some(Distrust::Deleted { counted, present }),
        std::cmp::Ordering::Greater => Some(Distrust::Uncounted { counted, present }),
    }
}

/// How a claim treats a candidate whose fence key is missing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MissingFence {
    /// The floor to claim it with (layout ms), also the value of the fence
    /// key the claim creates; the claim transaction checks it once more when
    /// `distrust` is `None`.
    pub floor: Millis,
    /// `None` when the count vouches that the key was never written.
    pub distrust: Option<Distrust>,
    /// The block's new key when the claim re-bases it (guarded by the
    /// block's key as read).
    pub rebase: Option<CountBase>,
}

/// The floor of a missing fence key in `block`: the namespace floor (or the
/// block's `absent_floor`, if higher) when the count vouches that no fence
/// key of the block was ever deleted, else `conservative` (raised to the
/// namespace floor), re-basing the block unless a held machine id of it lacks
/// its fence key. `root` is the namespace's root key. See the module
/// documentation.
pub fn missing_fence(
    block: &Block,
    root: &Counter,
    namespace_floor: Millis,
    conservative: Millis,
) -> MissingFence {
    let count = block.own.or(root);
    let distrust = vouches(count, block.markers, block.present).or((block.held_without_fence > 0)
        .then_some(Distrust::HeldWithoutFence {
            held: block.held_without_fence,
        }));
    let absent_floor = match count {
        Counter::Read(c) => Some(c.absent_floor),
        _ => None,
    };
    match (distrust, absent_floor) {
        (None, Some(absent_floor)) => MissingFence {
            floor: namespace_floor.max(absent_floor),
            distrust: None,
            rebase: None,
        },
        (distrust, absent_floor) => {
            let conservative = conservative.max(namespace_floor);
            // After the claim: present + 1 keys, markers + 1 markers.
            let rebase = (block.held_without_fence == 0).then(|| CountBase {
                base: i64::try_from(block.present)
                    .unwrap_or(i64::MAX)
                    .saturating_sub(i64::try_from(block.markers).unwrap_or(i64::MAX)),
                absent_floor: absent_floor.map_or(conservative, |f| f.max(conservative)),
            });
            MissingFence {
                floor: conservative,
                distrust,
                rebase,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NS_FLOOR: Millis = Millis(1_000);
    const CONSERVATIVE: Millis = Millis(90_000);

    fn base(base: i64, absent_floor: u64) -> Counter {
        Counter::Read(CountBase {
            base,
            absent_floor: Millis(absent_floor),
        })
    }

    fn block(own: Counter, markers: u64, present: u64, held_without_fence: u64) -> Block {
        Block {
            own,
            own_revision: 42,
            markers,
            present,
            held_without_fence,
        }
    }

    #[test]
    fn a_count_that_matches_vouches_for_the_namespace_floor() {
        let root = base(0, 0);
        for n in [0, 1, 64] {
            let b = block(Counter::Absent, n, n, 0);
            assert_eq!(
                missing_fence(&b, &root, NS_FLOOR, CONSERVATIVE),
                MissingFence {
                    floor: NS_FLOOR,
                    distrust: None,
                    rebase: None,
                }
            );
        }
        // A re-based block: its own key (not the root) counts, and its
        // floor stays in force above the namespace floor ...
        let b = block(base(-2, 70_000), 7, 5, 0);
        let m = missing_fence(&b, &root, NS_FLOOR, CONSERVATIVE);
        assert_eq!(
            (m.floor, m.distrust, m.rebase),
            (Millis(70_000), None, None)
        );
        // ... and the namespace floor, when higher, wins.
        let m = missing_fence(&b, &root, Millis(80_000), CONSERVATIVE);
        assert_eq!(m.floor, Millis(80_000));
        // Without a root, a re-based block still vouches for itself.
        let m = missing_fence(&b, &Counter::Absent, NS_FLOOR, CONSERVATIVE);
        assert_eq!(m.distrust, None);
    }

    #[test]
    fn a_deleted_key_costs_the_conservative_floor_and_re_bases_the_block() {
        // 3 created (3 markers), 2 left.
        let b = block(Counter::Absent, 3, 2, 0);
        let m = missing_fence(&b, &base(0, 0), NS_FLOOR, CONSERVATIVE);
        assert_eq!(
            m,
            MissingFence {
                floor: CONSERVATIVE,
                distrust: Some(Distrust::Deleted {
                    counted: 3,
                    present: 2
                }),
                // After the claim: base -1 + 4 markers = 3 keys present.
                rebase: Some(CountBase {
                    base: -1,
                    absent_floor: CONSERVATIVE
                }),
            }
        );
        assert_eq!(
            m.distrust.unwrap().to_string(),
            "3 fence keys were created in the block but only 2 are left: fence keys were deleted"
        );
        // The namespace floor raises the conservative floor too.
        let m = missing_fence(&b, &base(0, 0), Millis(100_000), CONSERVATIVE);
        assert_eq!(m.floor, Millis(100_000));
        assert_eq!(m.rebase.unwrap().absent_floor, Millis(100_000));
        // A re-base never lowers an earlier one's floor.
        let b = block(base(0, 95_000), 3, 2, 0);
        let m = missing_fence(&b, &base(0, 0), NS_FLOOR, CONSERVATIVE);
        assert_eq!(
            m.rebase,
            Some(CountBase {
                base: -1,
                absent_floor: Millis(95_000)
            })
        );
    }

    #[test]
    fn a_missing_unreadable_or_short_count_trusts_nothing() {
        let cases = [
            (
                block(Counter::Absent, 0, 4, 0),
                Counter::Absent,
                Distrust::Absent,
            ),
            (
                block(Counter::Absent, 0, 4, 0),
                Counter::Unreadable("x".into()),
                Distrust::Unreadable,
            ),
            (
                block(Counter::Unreadable("x".into()), 4, 4, 0),
                base(0, 0),
                Distrust::Unreadable,
            ),
            (
                block(Counter::Absent, 2, 4, 0),
                base(0, 0),
                Distrust::Uncounted {
                    counted: 2,
                    present: 4,
                },
            ),
        ];
        for (b, root, why) in cases {
            let m = missing_fence(&b, &root, NS_FLOOR, CONSERVATIVE);
            assert_eq!(m.floor, CONSERVATIVE, "{why}");
            assert_eq!(m.distrust, Some(why));
            // Re-based so that, after the claim, the count is the 5 keys
            // present.
            let r = m.rebase.unwrap();
            assert_eq!(r.base + i64::try_from(b.markers).unwrap() + 1, 5, "{why}");
            assert_eq!(r.absent_floor, CONSERVATIVE, "{why}");
        }
    }

    #[test]
    fn a_held_machine_id_without_its_fence_blocks_the_re_base() {
        // Counts agree, but a holder lost its key: no trust, no re-base.
        let b = block(Counter::Absent, 4, 4, 1);
        let m = missing_fence(&b, &base(0, 0), NS_FLOOR, CONSERVATIVE);
        assert_eq!(
            m,
            MissingFence {
                floor: CONSERVATIVE,
                distrust: Some(Distrust::HeldWithoutFence { held: 1 }),
                rebase: None,
            }
        );
        // A deletion as well: the count's own reason comes first.
        let b = block(Counter::Absent, 5, 4, 1);
        let m = missing_fence(&b, &base(0, 0), NS_FLOOR, CONSERVATIVE);
        assert_eq!(
            (m.floor, m.distrust, m.rebase),
            (
                CONSERVATIVE,
                Some(Distrust::Deleted {
                    counted: 5,
                    present: 4
                }),
                None
            )
        );
    }

    #[test]
    fn the_check_inside_the_claim_compares_keys_with_the_count() {
        let root = base(0, 0);
        assert_eq!(vouches(&root, 3, 3), None);
        assert_eq!(vouches(&base(-2, 9), 5, 3), None);
        assert_eq!(
            vouches(&root, 3, 2),
            Some(Distrust::Deleted {
                counted: 3,
                present: 2
            })
        );
        assert_eq!(
            vouches(&root, 3, 4),
            Some(Distrust::Uncounted {
                counted: 3,
                present: 4
            })
        );
        assert_eq!(vouches(&Counter::Absent, 0, 0), Some(Distrust::Absent));
        assert_eq!(
            vouches(&Counter::Unreadable("?".into()), 0, 0),
            Some(Distrust::Unreadable)
        );
    }

    #[test]
    fn a_count_round_trips_and_garbage_does_not_parse() {
        let c = CountBase {
            base: -3,
            absent_floor: Millis(123),
        };
        assert_eq!(c.encode(), "base -3\nabsent_floor_ms 123\n");
        assert_eq!(CountBase::parse(c.encode().as_bytes()), Some(c));
        assert_eq!(
            CountBase::parse(b"absent_floor_ms 9\nbase 2"),
            Some(CountBase {
                base: 2,
                absent_floor: Millis(9)
            })
        );
        assert_eq!(
            Counter::decode(Some(CountBase::NEW.encode().as_bytes())),
            Counter::Read(CountBase::NEW)
        );
        assert_eq!(Counter::decode(None), Counter::Absent);
        for bad in [
            &b""[..],
            b"3",
            b"base 3",
            b"base x\nabsent_floor_ms 1",
            b"base 3\nabsent_floor_ms -1",
            b"base 3\nabsent_floor_ms 1\nother 1",
            b"\xff",
        ] {
            assert_eq!(CountBase::parse(bad), None, "{bad:?}");
            assert!(matches!(Counter::decode(Some(bad)), Counter::Unreadable(_)));
        }
    }
}
