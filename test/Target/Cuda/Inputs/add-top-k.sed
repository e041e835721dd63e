# After tiny.toml's lm_head_ce (--emit=graph or --emit=train), a DFlash2
# selector's top 4 of the same logits (selector_candidates with the identity
# transform), which dflash-fuse-kernels folds into the lm_head kernel. Its
# results are read by nothing: the launch still writes them.
/= dflash\.lm_head_ce /{
p
s/^\( *\).* = dflash\.lm_head_ce \(%[0-9a-z_]*\), \(%[0-9a-z_]*\), %labels, %weights : .*$/\1%top_values, %top_candidates, %top_label_values = dflash.selector_candidates \2, \3, %labels, %weights {top_k = 4 : i64, multiplier = 1.0 : f64, softcap = 0.0 : f64} : (tensor<2x96x256xbf16>, tensor<1024x256xbf16>, tensor<2x96xi32>, tensor<2x96xf32>) -> (tensor<2x96x4xf32>, tensor<2x96x4xi32>, tensor<2x96xf32>)/
}
