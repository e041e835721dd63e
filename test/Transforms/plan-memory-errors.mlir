// RUN: dflash-opt %s --dflash-plan-memory="budget-gib=0.0001" --split-input-file --verify-diagnostics

// 1 MiB of weights and 4 x 256 KiB of activations per row: a 100 KiB budget
// fits no row at all.
// expected-error @+2 {{but the memory budget is 0.00 GiB}}
// expected-note @+1 {{not even one row fits}}
func.func @step(%x: tensor<4x512xbf16> {dflash.arg = #dflash.arg<input, "input_ids">},
                %w: tensor<1024x512xbf16> {dflash.arg = #dflash.arg<parameter, "w">})
    -> (tensor<4x1024xbf16> {dflash.arg = #dflash.arg<metric, "y">}) {
  %y = dflash.linear %x, %w : (tensor<4x512xbf16>, tensor<1024x512xbf16>) -> tensor<4x1024xbf16>
  return %y : tensor<4x1024xbf16>
}
