#version 450
// The device copy by the shader cores (bench/vulkan_baseline.h): 16-byte blocks, each
// invocation striding over the whole dispatch. On an NVIDIA H100, vkCmdCopyBuffer ran at
// a fraction of what the shader cores stream (bench/records/2026-11-26-nvidia-h100.md): on
// a discrete GPU the copy command need not reach what a kernel can, so the bench reads its
// kernels against the faster of the two copies.
#include "common.glsl"

layout(std430, set = 0, binding = 0) readonly buffer src_block { uvec4 src[]; };
layout(std430, set = 0, binding = 1) writeonly buffer dst_block { uvec4 dst[]; };

layout(push_constant) uniform Push {
  uint blocks;
} pc;

void main() {
  for (uint i = gl_GlobalInvocationID.x; i < pc.blocks; i += kvlab_stride()) dst[i] = src[i];
}
