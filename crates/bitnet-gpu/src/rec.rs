//! Recording a call's dispatches: counted, and, when the model's profile is on, each one in a
//! pass of its own between two timestamps.

use std::collections::BTreeMap;

/// Timestamps one profiled call may write (two a dispatch): wgpu's largest query set.
pub(crate) const PROFILE_QUERIES: u32 = 4096;

/// Records dispatches into one encoder, reusing a compute pass until a copy needs the
/// encoder (or, profiling, opening a timed pass per dispatch).
pub(crate) struct Rec<'e> {
    enc: &'e mut wgpu::CommandEncoder,
    pass: Option<wgpu::ComputePass<'static>>,
    timed: Option<&'e wgpu::QuerySet>,
    /// Each timed dispatch's kernel name, in order.
    pub(crate) names: Vec<&'static str>,
    /// Dispatches recorded.
    pub(crate) count: u32,
}

impl<'e> Rec<'e> {
    pub(crate) fn new(
        enc: &'e mut wgpu::CommandEncoder,
        timed: Option<&'e wgpu::QuerySet>,
    ) -> Self {
        Rec {
            enc,
            pass: None,
            timed,
            names: Vec::new(),
            count: 0,
        }
    }

    pub(crate) fn dispatch(
        &mut self,
        name: &'static str,
        pipeline: &wgpu::ComputePipeline,
        bind: &wgpu::BindGroup,
        groups: [u32; 3],
    ) {
        self.count += 1;
        let slot = u32::try_from(self.names.len()).unwrap_or(u32::MAX);
        if let (Some(qs), true) = (self.timed, slot < PROFILE_QUERIES / 2) {
            self.pass = None;
            let mut p = self.enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: Some(name),
                timestamp_writes: Some(wgpu::ComputePassTimestampWrites {
                    query_set: qs,
                    beginning_of_pass_write_index: Some(2 * slot),
                    end_of_pass_write_index: Some(2 * slot + 1),
                }),
            });
            p.set_pipeline(pipeline);
            p.set_bind_group(0, bind, &[]);
            p.dispatch_workgroups(groups[0], groups[1], groups[2]);
            self.names.push(name);
            return;
        }
        let enc = &mut *self.enc;
        let p = self.pass.get_or_insert_with(|| {
            enc.begin_compute_pass(&Default::default())
                .forget_lifetime()
        });
        p.set_pipeline(pipeline);
        p.set_bind_group(0, bind, &[]);
        p.dispatch_workgroups(groups[0], groups[1], groups[2]);
    }

    /// A buffer copy (ends the open pass).
    pub(crate) fn copy(
        &mut self,
        src: &wgpu::Buffer,
        src_at: u64,
        dst: &wgpu::Buffer,
        dst_at: u64,
        bytes: u64,
    ) {
        self.pass = None;
        self.enc
            .copy_buffer_to_buffer(src, src_at, dst, dst_at, bytes);
    }
}

/// Kernel times summed over the profiled calls.
#[derive(Debug, Default)]
pub(crate) struct Profile {
    /// name → (nanoseconds, dispatches)
    pub(crate) totals: BTreeMap<&'static str, (f64, u64)>,
    /// Tokens of the calls profiled.
    pub(crate) tokens: u64,
}

/// One kernel's share of the profiled calls, as [`crate::GpuModel::profile`] reports it.
#[derive(Debug, Clone, PartialEq)]
pub struct KernelTime {
    pub name: &'static str,
    /// Microseconds per token, summed over its dispatches.
    pub us_per_token: f64,
    /// Dispatches per token.
    pub per_token: f64,
}
