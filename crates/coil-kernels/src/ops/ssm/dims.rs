//! The sizes and inputs every Mamba-2 kernel of this folder shares.

/// Mamba-2 sizes: `n_head` heads of `head_dim` channels, `n_group` groups of
/// B/C with `d_state` each; head `h` uses group `h / (n_head / n_group)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mamba2Dims {
    pub n_head: usize,
    pub head_dim: usize,
    pub n_group: usize,
    pub d_state: usize,
}

impl Mamba2Dims {
    /// Panics unless the heads split evenly over the groups and `a` (and
    /// `d`, when given) hold one value per head: what every Mamba-2 scan of
    /// a layer checks first.
    pub(crate) fn check_heads(&self, a: &[f32], d: Option<&[f32]>) {
        assert!(
            self.n_group > 0 && self.n_head.is_multiple_of(self.n_group),
            "mamba2: n_head must be a multiple of n_group"
        );
        assert_eq!(a.len(), self.n_head, "mamba2: A is not [n_head]");
        if let Some(d) = d {
            assert_eq!(d.len(), self.n_head, "mamba2: D is not [n_head]");
        }
    }

    /// Panics unless a state of `len` values (and the one it moves from,
    /// `from` values) is `[H, P, N]`.
    pub(crate) fn check_state(&self, len: usize, from: Option<usize>) {
        let want = self.n_head * self.head_dim * self.d_state;
        assert_eq!(len, want, "mamba2: state is not [H, P, N]");
        if let Some(f) = from {
            assert_eq!(f, want, "mamba2: source state is not [H, P, N]");
        }
    }
}

/// x, B and C of a Mamba-2 scan: token `t`'s x `[H, P]` is `x[t·ldx ..]`,
/// its B and C `[G, N]` are `b[t·ldbc ..]` and `c[t·ldbc ..]`, so all three
/// can be read in place from the rows of one buffer (the convolution's
/// output `[x | B | C]`), or from three dense arrays ([`ScanInputs::dense`]).
#[derive(Clone, Copy)]
pub struct ScanInputs<'a> {
    pub x: &'a [f32],
    pub ldx: usize,
    pub b: &'a [f32],
    pub c: &'a [f32],
    pub ldbc: usize,
}

impl<'a> ScanInputs<'a> {
    /// x `[n_tokens, H, P]`, B and C `[n_tokens, G, N]`, each dense (and
    /// exactly that long).
    pub fn dense(
        dims: &Mamba2Dims,
        x: &'a [f32],
        b: &'a [f32],
        c: &'a [f32],
        n_tokens: usize,
    ) -> Self {
        let (ldx, ldbc) = (dims.n_head * dims.head_dim, dims.n_group * dims.d_state);
        assert_eq!(x.len(), n_tokens * ldx, "mamba2: x is not [n_tokens, H, P]");
        assert!(
            b.len() == n_tokens * ldbc && c.len() == b.len(),
            "mamba2: B or C is not [n_tokens, G, N]"
        );
        ScanInputs { x, ldx, b, c, ldbc }
    }

    /// Panics unless the rows of `n_tokens` tokens lie within the slices.
    pub(crate) fn check(&self, dims: &Mamba2Dims, n_tokens: usize) {
        let (row_x, row_bc) = (dims.n_head * dims.head_dim, dims.n_group * dims.d_state);
        assert!(
            self.ldx >= row_x && self.ldbc >= row_bc,
            "mamba2: row strides shorter than rows"
        );
        if n_tokens > 0 {
            let need = |ld: usize, w: usize| (n_tokens - 1) * ld + w;
            assert!(
                self.x.len() >= need(self.ldx, row_x),
                "mamba2: x is shorter than its rows"
            );
            assert!(
                self.b.len() >= need(self.ldbc, row_bc) && self.c.len() >= need(self.ldbc, row_bc),
                "mamba2: B or C is shorter than its rows"
            );
        }
    }
}
