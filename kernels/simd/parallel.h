// Internal: a small persistent worker pool for kernels that split work across cores
// (flash-decoding over the KV length). Placeholder until the fused decode kernel lands.
#pragma once
