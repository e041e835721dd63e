// RUN: dflash-opt %s --dflash-plan-memory="budget-gib=0.0001" --split-input-file --verify-diagnostics

// 1 MiB of weights and 4 x 256 KiB of activations per row: a 100 KiB budget
// fits no row at all. The largest part is cuBLASLt's workspace; then what
// needs less (a module without the spec's config names no counts, and has
// no optimizer state to shard).
// expected-error @+6 {{but the memory budget is 0.00 GiB}}
// expected-note @+5 {{the largest part: GEMM workspace, 32.00 MiB; what needs less, cheapest first:}}
// expected-note @+4 {{fewer rows_per_gpu: not even 1 fits (about 33.00 MiB with one row; now 4)}}
// expected-note @+3 {{[memory] recompute_activations = true}}
// expected-note @+2 {{[memory] recompute_mlp_products = true}}
// expected-note @+1 {{fewer [training] anchors_per_row: the draft slots' activations grow with them}}
func.func @step(%x: tensor<4x512xbf16> {dflash.arg = #dflash.arg<input, "input_ids">},
                %w: tensor<1024x512xbf16> {dflash.arg = #dflash.arg<parameter, "w">})
    -> (tensor<4x1024xbf16> {dflash.arg = #dflash.arg<metric, "y">}) {
  %y = dflash.linear %x, %w : (tensor<4x512xbf16>, tensor<1024x512xbf16>) -> tensor<4x1024xbf16>
  return %y : tensor<4x1024xbf16>
}
