// RUN: dflash-opt %s --split-input-file --verify-diagnostics
// dflash.row_slice: one micro-batch's rows of a step-wide tensor.

func.func @row_slice_rank(%x: tensor<8x16xi32>) {
  // expected-error @+1 {{(C1) input has rank 2 and the result rank 1}}
  %y = dflash.row_slice %x {offset = 0 : i64} : (tensor<8x16xi32>) -> tensor<2xi32>
  return
}

// -----

func.func @row_slice_dims(%x: tensor<8x16xi32>) {
  // expected-error @+1 {{(C2) dimension 1 is 16 in the input but 8 in the result}}
  %y = dflash.row_slice %x {offset = 0 : i64} : (tensor<8x16xi32>) -> tensor<2x8xi32>
  return
}

// -----

func.func @row_slice_rows(%x: tensor<8x16xi32>) {
  // expected-error @+1 {{(C3) rows [7, 9) are not inside the input's 8 rows}}
  %y = dflash.row_slice %x {offset = 7 : i64} : (tensor<8x16xi32>) -> tensor<2x16xi32>
  return
}

// -----

func.func @row_slice_type(%x: tensor<8x16xbf16>) {
  // expected-error @+1 {{(C4)}}
  %y = dflash.row_slice %x {offset = 2 : i64} : (tensor<8x16xbf16>) -> tensor<2x16xf32>
  return
}

// -----

func.func @row_slice_ok(%x: tensor<8x16xi32>) -> tensor<2x16xi32> {
  %y = dflash.row_slice %x {offset = 6 : i64} : (tensor<8x16xi32>) -> tensor<2x16xi32>
  return %y : tensor<2x16xi32>
}
