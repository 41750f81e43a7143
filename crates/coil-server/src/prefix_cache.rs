//! The prefix cache's index: a radix tree over token ids whose keys are the
//! token histories of *parked* sequences (finished requests whose memory —
//! attention cells, recurrent state and its rollback checkpoints — is kept
//! in an engine slot instead of being cleared), with least-recently-used
//! order for eviction. Byte accounting is the scheduler's: forks share
//! memory, so what a parked sequence costs depends on the others.
//!
//! The tree only indexes; the engine slots own the memory. A lookup gives
//! the sequence sharing the longest prefix with a prompt; the scheduler
//! forks or adopts it and rolls it back to that length (restoring the
//! nearest recurrent checkpoint), then processes only the rest.

use coil::memory::SeqId;
use std::collections::{BTreeMap, HashMap};

type NodeId = usize;
const ROOT: NodeId = 0;

#[derive(Debug, Default)]
struct Node {
    /// Tokens on the edge from the parent (empty for the root).
    edge: Vec<u32>,
    parent: NodeId,
    /// First token of each child's edge → child.
    children: BTreeMap<u32, NodeId>,
    /// Sequences whose history ends exactly here.
    seqs: Vec<SeqId>,
}

#[derive(Clone, Copy, Debug)]
struct Entry {
    node: NodeId,
    len: usize,
    last_used: u64,
}

/// A match: `seq` shares its first `len` tokens with the query.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Match {
    pub seq: SeqId,
    pub len: usize,
}

#[derive(Debug)]
pub struct PrefixCache {
    nodes: Vec<Node>,
    free: Vec<NodeId>,
    entries: HashMap<SeqId, Entry>,
    clock: u64,
}

impl Default for PrefixCache {
    fn default() -> Self {
        Self::new()
    }
}

fn common_len(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

impl PrefixCache {
    pub fn new() -> Self {
        PrefixCache {
            nodes: vec![Node::default()],
            free: Vec::new(),
            entries: HashMap::new(),
            clock: 0,
        }
    }

    /// Parked sequences.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn contains(&self, seq: SeqId) -> bool {
        self.entries.contains_key(&seq)
    }

    /// The parked sequences, in no particular order.
    pub fn seqs(&self) -> impl Iterator<Item = SeqId> + '_ {
        self.entries.keys().copied()
    }

    /// Tokens the parked sequences hold.
    pub fn tokens(&self) -> usize {
        self.entries.values().map(|e| e.len).sum()
    }

    /// Tree nodes in use (root included).
    pub fn n_nodes(&self) -> usize {
        self.nodes.len() - self.free.len()
    }

    fn alloc(&mut self, node: Node) -> NodeId {
        match self.free.pop() {
            Some(id) => {
                self.nodes[id] = node;
                id
            }
            None => {
                self.nodes.push(node);
                self.nodes.len() - 1
            }
        }
    }

    fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    /// Parks `seq` holding `tokens` (replacing an earlier entry of it).
    pub fn insert(&mut self, seq: SeqId, tokens: &[u32]) {
        self.remove(seq);
        let mut node = ROOT;
        let mut at = 0;
        while at < tokens.len() {
            let first = tokens[at];
            let Some(&child) = self.nodes[node].children.get(&first) else {
                let leaf = self.alloc(Node {
                    edge: tokens[at..].to_vec(),
                    parent: node,
                    ..Default::default()
                });
                self.nodes[node].children.insert(first, leaf);
                node = leaf;
                at = tokens.len();
                break;
            };
            let n = common_len(&self.nodes[child].edge, &tokens[at..]);
            if n < self.nodes[child].edge.len() {
                // Split the edge: node → mid (n tokens) → child (the rest).
                let rest = self.nodes[child].edge.split_off(n);
                let mid_edge = std::mem::replace(&mut self.nodes[child].edge, rest);
                let mid = self.alloc(Node {
                    edge: mid_edge,
                    parent: node,
                    ..Default::default()
                });
                let child_first = self.nodes[child].edge[0];
                self.nodes[mid].children.insert(child_first, child);
                self.nodes[child].parent = mid;
                self.nodes[node].children.insert(first, mid);
                node = mid;
            } else {
                node = child;
            }
            at += n;
        }
        debug_assert_eq!(at, tokens.len());
        self.nodes[node].seqs.push(seq);
        let last_used = self.tick();
        self.entries.insert(
            seq,
            Entry {
                node,
                len: tokens.len(),
                last_used,
            },
        );
    }

    /// Forgets `seq`; returns whether it was parked.
    pub fn remove(&mut self, seq: SeqId) -> bool {
        let Some(e) = self.entries.remove(&seq) else {
            return false;
        };
        let node = e.node;
        self.nodes[node].seqs.retain(|&s| s != seq);
        self.prune(node);
        true
    }

    /// Drops empty leaves upwards and merges pass-through nodes into their
    /// only child, keeping the tree compressed.
    fn prune(&mut self, mut node: NodeId) {
        while node != ROOT {
            let n = &self.nodes[node];
            if !n.seqs.is_empty() {
                return;
            }
            let parent = n.parent;
            match n.children.len() {
                0 => {
                    let first = n.edge[0];
                    self.nodes[parent].children.remove(&first);
                    self.nodes[node] = Node::default();
                    self.free.push(node);
                    node = parent;
                }
                1 => {
                    let Some((_, &child)) = self.nodes[node].children.iter().next() else {
                        return;
                    };
                    let mut edge = std::mem::take(&mut self.nodes[node].edge);
                    edge.extend_from_slice(&self.nodes[child].edge);
                    let first = edge[0];
                    self.nodes[child].edge = edge;
                    self.nodes[child].parent = parent;
                    self.nodes[parent].children.insert(first, child);
                    self.nodes[node] = Node::default();
                    self.free.push(node);
                    return;
                }
                _ => return,
            }
        }
    }

    /// The parked sequence sharing the longest prefix with `query` (the
    /// most recently used one among equals), if any shares a token.
    pub fn longest_match(&self, query: &[u32]) -> Option<Match> {
        let mut node = ROOT;
        let mut depth = 0;
        while let Some(&first) = query.get(depth) {
            let Some(&child) = self.nodes[node].children.get(&first) else {
                break;
            };
            let n = common_len(&self.nodes[child].edge, &query[depth..]);
            depth += n;
            node = child;
            if n < self.nodes[child].edge.len() {
                break;
            }
        }
        if depth == 0 {
            return None;
        }
        // Every sequence below `node` shares the first `depth` tokens.
        let mut best: Option<(u64, SeqId)> = None;
        let mut stack = vec![node];
        while let Some(n) = stack.pop() {
            for &s in &self.nodes[n].seqs {
                if let Some(e) = self.entries.get(&s) {
                    if best.is_none_or(|(t, _)| e.last_used > t) {
                        best = Some((e.last_used, s));
                    }
                }
            }
            stack.extend(self.nodes[n].children.values().copied());
        }
        best.map(|(_, seq)| Match { seq, len: depth })
    }

    /// Every parked sequence sharing at least one token with `query`, with
    /// the length it shares (one walk down the query's path: a subtree
    /// leaving the path shares the depth where it leaves).
    pub fn matches(&self, query: &[u32]) -> Vec<Match> {
        let mut out = Vec::new();
        let mut node = ROOT;
        let mut depth = 0;
        loop {
            let next = query
                .get(depth)
                .and_then(|t| self.nodes[node].children.get(t));
            for &child in self.nodes[node].children.values() {
                if Some(&child) != next {
                    self.collect(child, depth, &mut out);
                }
            }
            let Some(&child) = next else {
                break;
            };
            let n = common_len(&self.nodes[child].edge, &query[depth..]);
            depth += n;
            if n < self.nodes[child].edge.len() {
                self.collect(child, depth, &mut out);
                break;
            }
            node = child;
            for &s in &self.nodes[node].seqs {
                out.push(Match { seq: s, len: depth });
            }
        }
        out.retain(|m| m.len > 0);
        out
    }

    /// Pushes every sequence below `node` as sharing `len` tokens.
    fn collect(&self, node: NodeId, len: usize, out: &mut Vec<Match>) {
        let mut stack = vec![node];
        while let Some(n) = stack.pop() {
            out.extend(self.nodes[n].seqs.iter().map(|&seq| Match { seq, len }));
            stack.extend(self.nodes[n].children.values().copied());
        }
    }

    /// When `seq` was last used (larger: more recent).
    pub fn last_used(&self, seq: SeqId) -> Option<u64> {
        self.entries.get(&seq).map(|e| e.last_used)
    }

    /// Marks `seq` as just used.
    pub fn touch(&mut self, seq: SeqId) {
        let t = self.tick();
        if let Some(e) = self.entries.get_mut(&seq) {
            e.last_used = t;
        }
    }

    /// The least recently used parked sequence other than `except`.
    pub fn lru(&self, except: Option<SeqId>) -> Option<SeqId> {
        self.entries
            .iter()
            .filter(|(s, _)| Some(**s) != except)
            .min_by_key(|(_, e)| e.last_used)
            .map(|(&s, _)| s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_longest_prefix() {
        let mut c = PrefixCache::new();
        assert_eq!(c.longest_match(&[1, 2, 3]), None);
        c.insert(0, &[1, 2, 3, 4, 5]);
        c.insert(1, &[1, 2, 7, 8]);
        c.insert(2, &[9]);
        assert_eq!(c.len(), 3);
        let mut seqs: Vec<SeqId> = c.seqs().collect();
        seqs.sort_unstable();
        assert_eq!(seqs, [0, 1, 2]);
        assert_eq!(
            c.longest_match(&[1, 2, 3, 4, 5, 6]),
            Some(Match { seq: 0, len: 5 })
        );
        assert_eq!(
            c.longest_match(&[1, 2, 3, 9]),
            Some(Match { seq: 0, len: 3 })
        );
        assert_eq!(c.longest_match(&[1, 2, 7]), Some(Match { seq: 1, len: 3 }));
        assert_eq!(c.longest_match(&[9, 9]), Some(Match { seq: 2, len: 1 }));
        assert_eq!(c.longest_match(&[5]), None);
        // Both share [1, 2]: the most recently used wins.
        assert_eq!(c.longest_match(&[1, 2]).map(|m| m.seq), Some(1));
        c.touch(0);
        assert_eq!(c.longest_match(&[1, 2]).map(|m| m.seq), Some(0));
        assert_eq!(c.lru(None), Some(1));
        assert_eq!(c.lru(Some(1)), Some(2));
    }

    #[test]
    fn removal_prunes_and_recompresses() {
        let mut c = PrefixCache::new();
        c.insert(0, &[1, 2, 3, 4]);
        c.insert(1, &[1, 2, 5]);
        c.insert(2, &[1, 2]);
        assert!(c.remove(1));
        assert!(!c.remove(1));
        assert_eq!(c.longest_match(&[1, 2, 5]), Some(Match { seq: 2, len: 2 }));
        assert!(c.remove(2));
        // [1, 2] and [3, 4] merged back into one edge.
        assert_eq!(c.n_nodes(), 2);
        assert_eq!(
            c.longest_match(&[1, 2, 3, 4]),
            Some(Match { seq: 0, len: 4 })
        );
        assert!(c.remove(0));
        assert_eq!(c.n_nodes(), 1);
        assert!(c.is_empty());
        // Re-inserting a sequence replaces its entry.
        c.insert(3, &[4, 4]);
        c.insert(3, &[4, 5]);
        assert_eq!(c.len(), 1);
        assert_eq!(c.longest_match(&[4, 4]), Some(Match { seq: 3, len: 1 }));
        // Empty histories are allowed (they match nothing).
        c.insert(4, &[]);
        assert_eq!(c.tokens(), 2);
    }

    #[test]
    fn random_inserts_and_removals_agree_with_a_linear_scan() {
        let mut c = PrefixCache::new();
        let mut plain: HashMap<SeqId, Vec<u32>> = HashMap::new();
        let mut x = 12345u64;
        let mut rnd = |n: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % n
        };
        for _ in 0..2000 {
            let seq = rnd(12) as SeqId;
            if rnd(3) == 0 {
                c.remove(seq);
                plain.remove(&seq);
            } else {
                let len = rnd(8) as usize;
                let toks: Vec<u32> = (0..len).map(|_| rnd(3) as u32).collect();
                c.insert(seq, &toks);
                plain.insert(seq, toks);
            }
            let len = rnd(8) as usize;
            let q: Vec<u32> = (0..len).map(|_| rnd(3) as u32).collect();
            let want = plain.values().map(|t| common_len(t, &q)).max().unwrap_or(0);
            let mut all = c.matches(&q);
            all.sort_by_key(|m| m.seq);
            let mut want_all: Vec<Match> = plain
                .iter()
                .map(|(&seq, t)| Match {
                    seq,
                    len: common_len(t, &q),
                })
                .filter(|m| m.len > 0)
                .collect();
            want_all.sort_by_key(|m| m.seq);
            assert_eq!(all, want_all);
            match c.longest_match(&q) {
                None => assert_eq!(want, 0),
                Some(m) => {
                    assert_eq!(m.len, want);
                    assert_eq!(common_len(&plain[&m.seq], &q), want);
                }
            }
        }
    }
}
