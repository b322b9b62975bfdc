//===- ContractTest.cpp - figures the compiler states about this runtime ---===//
//
// The compiler's cost model describes this runtime's model (docs/contracts.md). These
// tests pin figures `mtpc` prints for the bundled examples, so a change on
// either side that breaks the agreement fails here or in
// test/tools/contract.test, which pins the same numbers on the compiler side.
//
//===----------------------------------------------------------------------===//

#include "mtprt/torch/Model.h"

#include <gtest/gtest.h>

using namespace mtprt;

namespace {

TEST(Contract, ParametersOfTheTinyExample) {
  // examples/00_tiny.mtp: 4 layers, hidden 64, 4 heads, ffn 256, vocab 512,
  // seq 32; topic classify(4) on layer 4, pos tag(12) and chunk tag(8) on 2.
  ModelConfig c;
  c.layers = 4, c.hidden = 64, c.heads = 4, c.ffn = 256, c.vocab = 512;
  c.seq = 32, c.dropout = 0.1;
  std::vector<HeadConfig> heads(3);
  heads[0] = {"pos", HeadKind::Tag, 2};
  heads[0].classes = 12;
  heads[1] = {"chunk", HeadKind::Tag, 2};
  heads[1].classes = 8;
  heads[2] = {"topic", HeadKind::Classify, 4};
  heads[2].classes = 4;
  Model m(c, heads);
  // `mtpc plan examples/00_tiny.mtp`: "240856 gradient values".
  EXPECT_EQ(m.numParameters(), 240856);
}

TEST(Contract, ParametersOfADecoderHead) {
  // test/tools/contract.test's spec: 2 layers, hidden 32, 4 heads, ffn 64,
  // vocab 100, seq 16; a decoder(layers = 2, vocab = 50, target_seq = 8).
  ModelConfig c;
  c.layers = 2, c.hidden = 32, c.heads = 4, c.ffn = 64, c.vocab = 100;
  c.seq = 16;
  std::vector<HeadConfig> heads(1);
  heads[0] = {"mt", HeadKind::Decoder, 2};
  heads[0].decoderLayers = 2;
  heads[0].targetVocab = 50;
  heads[0].targetSeq = 8;
  Model m(c, heads);
  // `mtpc plan` on that spec: "50162 gradient values".
  EXPECT_EQ(m.numParameters(), 50162);
}

} // namespace
