// mv_rows.wgsl's outputs for Q, K and V as one matrix (rows below seg1 Q, below seg2 K, the
// rest V) with rope.wgsl's work in its epilogue: RoPE on the new Q and K rows and K and V
// stored into the cache at position pos0 + t, through `store_kv` of the prelude in front of
// this file (mv_store_f16.wgsl rounds to f16, mv_store_f32.wgsl copies). A thread holds both
// dims of its two rotary pairs: with `normal`, rows 2i, 2i + 1 (four consecutive rows); else
// (NeoX) rows d, d + 1 of a head with d + half, d + half + 1, d even. The host binds this
// kernel only where n_rot = head_dim and head_dim is a multiple of 4, so that every head is
// whole in groups of four rows and every pair rotates.
@group(0) @binding(2) var<storage, read> wt: array<vec4<u32>>;
@group(0) @binding(3) var<storage, read> sc: array<f32>;
// Q out: [t][seg1]
@group(0) @binding(6) var<storage, read_write> y0: array<f32>;
// [pos][half] cos, then [pos][half] sin after n_ctx·half values
@group(0) @binding(9) var<storage, read> table: array<f32>;

struct Rope {
    head_dim: u32,
    half: u32,
    normal: u32,
    n_ctx: u32,
}

@group(0) @binding(10) var<uniform> rope: Rope;

fn thread_rows(wg: u32, lid: u32) -> vec4<u32> {
    let g = wg * WG + lid;
    let r0 = 4u * g;
    if rope.normal != 0u || r0 >= dims.seg2 {
        return r0 + vec4<u32>(0u, 1u, 2u, 3u);
    }
    // Group lg of a head's head_dim / 4 takes the pairs at dims 2lg and 2lg + 1.
    let per = rope.head_dim / 4u;
    let d = (g / per) * rope.head_dim + 2u * (g % per);
    return d + vec4<u32>(0u, 1u, rope.half, rope.half + 1u);
}

// (a, b) turned by angle i of position pos.
fn turn(a: f32, b: f32, pos: u32, i: u32) -> vec2<f32> {
    let o = pos * rope.half + i;
    let c = table[o];
    let s = table[rope.n_ctx * rope.half + o];
    return vec2<f32>(a * c - b * s, a * s + b * c);
}

fn emit(t: u32, rows: vec4<u32>, v: vec4<f32>) {
    if rows.x >= dims.n_out {
        return;
    }
    let pos = step.pos0 + t;
    let kv = dims.seg2 - dims.seg1;
    if rows.x >= dims.seg2 {
        let e = pos * kv + rows.x - dims.seg2;
        store_kv(true, e, v.x, v.y);
        store_kv(true, e + 2u, v.z, v.w);
        return;
    }
    let d = rows % vec4<u32>(rope.head_dim);
    var o: vec4<f32>;
    if rope.normal != 0u {
        let p = turn(v.x, v.y, pos, d.x / 2u);
        let q = turn(v.z, v.w, pos, d.z / 2u);
        o = vec4<f32>(p, q);
    } else {
        let p = turn(v.x, v.z, pos, d.x);
        let q = turn(v.y, v.w, pos, d.y);
        o = vec4<f32>(p.x, q.x, p.y, q.y);
    }
    if rows.x < dims.seg1 {
        for (var i = 0u; i < 4u; i++) {
            y0[t * dims.seg1 + rows[i]] = o[i];
        }
    } else {
        let e = pos * kv + rows - vec4<u32>(dims.seg1);
        store_kv(false, e.x, o.x, o.y);
        store_kv(false, e.z, o.z, o.w);
    }
}
