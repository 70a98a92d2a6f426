//! Property tests of the extent allocator against a model: a bitmap of pool units.

use pool::{Extent, ExtentAllocator};
use proptest::prelude::*;

const UNIT: u64 = 2 << 20;
const UNITS: u64 = 48;

#[derive(Clone, Debug)]
enum Op {
    Alloc(u64),
    AllocAt(u64, u64),
    Free(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0u64..10).prop_map(Op::Alloc),
        (0u64..UNITS + 2, 0u64..10).prop_map(|(o, l)| Op::AllocAt(o, l)),
        any::<usize>().prop_map(Op::Free),
    ]
}

proptest! {
    #[test]
    fn allocator_matches_a_bitmap_model(ops in prop::collection::vec(op(), 1..200)) {
        let mut a = ExtentAllocator::new(UNITS * UNIT, UNIT).unwrap();
        let mut used = [false; UNITS as usize];
        let mut held: Vec<Extent> = Vec::new();
        for op in ops {
            match op {
                Op::Alloc(n) => {
                    let r = a.alloc(n * UNIT);
                    // First fit in the model.
                    let want = (n > 0).then(|| (0..UNITS).find(|&s| s + n <= UNITS
                        && (s..s + n).all(|u| !used[u as usize]))).flatten();
                    match (r, want) {
                        (Ok(e), Some(s)) => {
                            prop_assert_eq!(e.offset, s * UNIT);
                            for u in s..s + n { used[u as usize] = true; }
                            held.push(e);
                        }
                        (Err(_), None) => {}
                        (r, w) => prop_assert!(false, "alloc {n}: got {r:?}, model {w:?}"),
                    }
                }
                Op::AllocAt(o, n) => {
                    let e = Extent { offset: o * UNIT, len: n * UNIT };
                    let ok = n > 0 && o + n <= UNITS && (o..o + n).all(|u| !used[u as usize]);
                    let r = a.alloc_at(e);
                    prop_assert_eq!(r.is_ok(), ok, "alloc_at {:?}: {:?}", e, r);
                    if ok {
                        for u in o..o + n { used[u as usize] = true; }
                        held.push(e);
                    }
                }
                Op::Free(i) if !held.is_empty() => {
                    let e = held.swap_remove(i % held.len());
                    a.free(e).unwrap();
                    for u in e.offset / UNIT..e.end() / UNIT { used[u as usize] = false; }
                }
                Op::Free(_) => {}
            }
            // The free list is exactly the model's free runs, maximal and sorted.
            let mut runs = Vec::new();
            let mut u = 0;
            while u < UNITS {
                if used[u as usize] { u += 1; continue; }
                let s = u;
                while u < UNITS && !used[u as usize] { u += 1; }
                runs.push(Extent { offset: s * UNIT, len: (u - s) * UNIT });
            }
            prop_assert_eq!(a.free_extents(), runs.as_slice());
        }
    }
}
