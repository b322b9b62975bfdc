mtp.model @bad {
  mtp.backbone transformer(layers = 4, hidden = 64, heads = 4, ffn = 256, vocab = 100, seq = 16, dropout = 0.1)
  mtp.task @deep : tag(labels = 5) from layer 9 loss cross_entropy weight 1.0
}
