//! The checker over every id of every client in the run: none taken twice,
//! and each call's ids in the order the contract promises.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;

use snowkeep_client::Layout;

/// Every id taken in this run, by any client in any scenario.
static SEEN: Mutex<Option<HashSet<u64>>> = Mutex::new(None);

/// Ids taken, for the final report.
pub fn seen() -> usize {
    SEEN.lock().unwrap().as_ref().map_or(0, HashSet::len)
}

/// Records `ids`; an error names the first id seen before.
pub fn record(ids: &[u64]) -> Result<(), String> {
    let mut seen = SEEN.lock().unwrap();
    let seen = seen.get_or_insert_with(HashSet::new);
    let mut duplicates = Vec::new();
    for &id in ids {
        if !seen.insert(id) {
            duplicates.push(id);
        }
    }
    match duplicates.as_slice() {
        [] => Ok(()),
        [first, ..] => Err(format!(
            "{} duplicate ids (first {first}) among {} ids",
            duplicates.len(),
            ids.len()
        )),
    }
}

/// `ids` strictly ascending (one `NextIds` call, one server).
pub fn ascending(ids: &[u64]) -> Result<(), String> {
    match ids.windows(2).position(|w| w[0] >= w[1]) {
        None => Ok(()),
        Some(i) => Err(format!(
            "ids not strictly ascending at {i}: {} then {}",
            ids[i],
            ids[i + 1]
        )),
    }
}

/// `ids` strictly ascending within each machine id's part (a stream
/// resumed on other servers); the machine ids seen, in order of appearance.
pub fn ascending_per_machine_id(layout: &Layout, ids: &[u64]) -> Result<Vec<u16>, String> {
    let mut last: HashMap<u16, u64> = HashMap::new();
    let mut order = Vec::new();
    for &id in ids {
        let m = layout
            .decode(id)
            .ok_or_else(|| format!("id {id} is outside the layout"))?
            .machine_id
            .0;
        match last.insert(m, id) {
            None => order.push(m),
            Some(prev) if prev >= id => {
                return Err(format!(
                    "ids of machine id {m} not ascending: {prev} then {id}"
                ))
            }
            Some(_) => {}
        }
    }
    Ok(order)
}
