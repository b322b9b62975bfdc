// The GLUE-style multi-task model of the spec sketch, at the spec level: a
// 24-layer transformer shared by six task heads that read different layers.
// Until the .mtp frontend lands this is what `mtpc` takes; it is exactly what
// `mtpc glue_mt.mtp --emit=mlir` will print.
mtp.model @glue_mt {
  mtp.backbone transformer(layers = 24, hidden = 1024, heads = 16, ffn = 4096, vocab = 32000, seq = 512, dropout = 0.1)

  mtp.task @mnli : classify(classes = 3) from pooled layer 24 loss cross_entropy weight 1.0
  mtp.task @ner : tag(labels = 9) from layer 24 loss cross_entropy weight 1.0
  mtp.task @pos : tag(labels = 17) from layer 8 loss cross_entropy weight 1.0
  mtp.task @chunk : tag(labels = 23) from layer 8 loss cross_entropy weight 1.0
  mtp.task @squad : span() from layer 24 loss cross_entropy weight 1.0
  mtp.task @mt : decoder(layers = 6, vocab = 32000, target_seq = 128) from layer 24 loss cross_entropy weight 1.0

  mtp.correlate @pos, @chunk = 0.8
  mtp.correlate @ner, @mt = 0.1

  mtp.budget device "A100_32GB" memory 32 GiB headroom 2 GiB link 32 GBps gpus 8 batch 64 micro 8 precision bf16
}
