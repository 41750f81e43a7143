//! The search tables of ggml's lattice quantizers (IQ1, IQ2, IQ3), built
//! from the grids of [`super::grids`] as ggml's `iq2xs_init_impl` /
//! `iq3xs_init_impl` build them from theirs.
//!
//! A grid entry is a point of N coordinates (8 for IQ1/IQ2, 4 for IQ3), each
//! a level index `l` (its position in the grid's `*_LEVELS`); the search
//! works with the odd values `2l + 1`. A point whose level indices are
//! packed `bits` to a coordinate into `u` is either on the grid
//! (`map[u]` = its index) or not, and then `map[u]` = `−(o + 1)` where
//! `neighbours[o]` is a count `n` followed by the `n` grid entries nearest it
//! in squared distance (every entry at one of the `nwant` smallest distances,
//! by distance then index).

#![allow(clippy::needless_range_loop)]

use std::sync::OnceLock;

use super::grids::{
    IQ1S_GRID, IQ1S_LEVELS, IQ2S_GRID, IQ2S_LEVELS, IQ2XS_GRID, IQ2XS_LEVELS, IQ2XXS_GRID,
    IQ2XXS_LEVELS, IQ3S_GRID, IQ3S_LEVELS, IQ3XXS_GRID, IQ3XXS_LEVELS,
};

/// A grid with its map and neighbour lists.
pub(crate) struct Lattice<const N: usize> {
    /// Grid entry `k`'s coordinates as `2l + 1`.
    pub grid: Vec<[i8; N]>,
    map: Vec<i32>,
    neighbours: Vec<u16>,
    bits: u32,
}

/// Where a packed point lies: on the grid, or off it with these neighbours.
pub(crate) enum Place<'a> {
    On(usize),
    Off(&'a [u16]),
}

impl<const N: usize> Lattice<N> {
    /// Builds the tables of a grid whose entries have coordinates `coords(k)`
    /// (values of `levels`), with level indices packed `bits` to a coordinate.
    fn build<T: PartialEq + Copy>(
        n_grid: usize,
        coords: impl Fn(usize) -> [T; N],
        levels: &[T],
        bits: u32,
        nwant: usize,
    ) -> Lattice<N> {
        let grid: Vec<[i8; N]> = (0..n_grid)
            .map(|k| {
                coords(k).map(|c| {
                    let l = levels.iter().position(|&v| v == c).unwrap_or(0);
                    2 * l as i8 + 1
                })
            })
            .collect();
        // ggml's map covers every packing of 2-bit levels below 3 (43692
        // points) or of 3-bit ones (4096)
        let map_size = if bits == 2 { 43692 } else { 4096 };
        let mask = (1usize << bits) - 1;
        let mut map = vec![-1i32; map_size];
        for (k, p) in grid.iter().enumerate() {
            let u = p.iter().enumerate().fold(0usize, |u, (i, &c)| {
                u | (((c as usize - 1) / 2) << (bits as usize * i))
            });
            map[u] = k as i32;
        }
        let mut neighbours = Vec::new();
        let mut d2 = vec![0u32; n_grid];
        for u in 0..map_size {
            if map[u] >= 0 {
                continue;
            }
            let pos: [i32; N] =
                std::array::from_fn(|i| 2 * ((u >> (bits as usize * i)) & mask) as i32 + 1);
            for (d, p) in d2.iter_mut().zip(&grid) {
                *d = p
                    .iter()
                    .zip(&pos)
                    .map(|(&g, &q)| ((g as i32 - q) * (g as i32 - q)) as u32)
                    .sum();
            }
            // the nwant smallest distinct distances
            let mut nearest: Vec<u32> = Vec::with_capacity(nwant + 1);
            for &d in &d2 {
                if !nearest.contains(&d) {
                    let at = nearest.partition_point(|&v| v < d);
                    if at < nwant {
                        nearest.insert(at, d);
                        nearest.truncate(nwant);
                    }
                }
            }
            map[u] = -(neighbours.len() as i32 + 1);
            let start = neighbours.len();
            neighbours.push(0);
            for &d in &nearest {
                neighbours.extend((0..n_grid).filter(|&j| d2[j] == d).map(|j| j as u16));
            }
            neighbours[start] = (neighbours.len() - start - 1) as u16;
        }
        Lattice {
            grid,
            map,
            neighbours,
            bits,
        }
    }

    /// Packs level indices (each below `2^bits`, and below 3 for 2-bit grids).
    #[inline]
    pub fn pack(&self, l: &[i8]) -> usize {
        l.iter().enumerate().fold(0, |u, (i, &v)| {
            u | ((v as usize) << (self.bits as usize * i))
        })
    }

    /// Where the point with packed level indices `u` lies.
    #[inline]
    pub fn place(&self, u: usize) -> Place<'_> {
        match self.map.get(u) {
            Some(&k) if k >= 0 => Place::On(k as usize),
            Some(&k) => {
                let o = (-(k + 1)) as usize;
                let n = self.neighbours.get(o).copied().unwrap_or(0) as usize;
                Place::Off(self.neighbours.get(o + 1..o + 1 + n).unwrap_or(&[]))
            }
            None => Place::Off(&[]),
        }
    }

    /// Grid entry `k`'s level indices.
    #[inline]
    pub fn levels(&self, k: usize) -> [i8; N] {
        self.grid[k].map(|c| (c - 1) / 2)
    }
}

macro_rules! lattice {
    ($name:ident, $n:literal, $grid:ident, $levels:ident, $bits:literal, $nwant:literal, $ty:ty) => {
        pub(crate) fn $name() -> &'static Lattice<$n> {
            static L: OnceLock<Lattice<$n>> = OnceLock::new();
            L.get_or_init(|| {
                Lattice::build(
                    $grid.len(),
                    |k| {
                        let b = $grid[k].to_le_bytes();
                        std::array::from_fn(|i| b[i] as $ty)
                    },
                    &$levels,
                    $bits,
                    $nwant,
                )
            })
        }
    };
}

// name, coordinates, grid, levels, bits per level index, nwant (ggml's)
lattice!(iq2xxs, 8, IQ2XXS_GRID, IQ2XXS_LEVELS, 2, 2, u8);
lattice!(iq2xs, 8, IQ2XS_GRID, IQ2XS_LEVELS, 2, 2, u8);
lattice!(iq2s, 8, IQ2S_GRID, IQ2S_LEVELS, 2, 1, u8);
lattice!(iq1s, 8, IQ1S_GRID, IQ1S_LEVELS, 2, 3, i8);
lattice!(iq3xxs, 4, IQ3XXS_GRID, IQ3XXS_LEVELS, 3, 2, u8);
lattice!(iq3s, 4, IQ3S_GRID, IQ3S_LEVELS, 3, 3, u8);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_grid_entry_maps_to_itself_and_others_have_neighbours() {
        let l = iq3xxs();
        for k in 0..l.grid.len() {
            let u = l.pack(&l.levels(k));
            assert!(matches!(l.place(u), Place::On(j) if j == k));
        }
        let mut off = 0;
        for u in 0..4096 {
            if let Place::Off(n) = l.place(u) {
                assert!(!n.is_empty(), "{u}");
                off += 1;
            }
        }
        assert_eq!(off, 4096 - 256);
    }

    #[test]
    fn two_bit_lattices_map_every_packing_below_three() {
        let l = iq2s();
        let mut on = 0;
        for u in 0..43692 {
            match l.place(u) {
                Place::On(_) => on += 1,
                Place::Off(n) => assert!(!n.is_empty(), "{u}"),
            }
        }
        assert_eq!(on, 1024);
    }
}
