//===- ContractTest.cpp - figures the compiler states about this runtime ---===//
//
// The compiler's cost model describes this runtime's model (docs/contracts.md). These
// tests pin figures `mtpc` prints for the bundled examples, so a change on
// either side that breaks the agreement fails here or in
// test/tools/contract.test, which pins the same numbers on the compiler side.
//
//===----------------------------------------------------------------------===//

#include "mtprt/torch/Model.h"

#include "Fixtures.h"

#include <gtest/gtest.h>

using namespace mtprt;
using namespace fixtures;

namespace {

TEST(Contract, ParametersOfTheTinyExample) {
  // examples/00_tiny.mtp: 4 layers, hidden 64, 4 heads, ffn 256, vocab 512,
  // seq 32; topic classify(4) on layer 4, pos tag(12) and chunk tag(8) on 2.
  ModelConfig c;
  c.layers = 4, c.hidden = 64, c.heads = 4, c.ffn = 256, c.vocab = 512;
  c.seq = 32, c.dropout = 0.1;
  Model m(c, {tagHead("pos", 2, 12), tagHead("chunk", 2, 8),
              classifyHead("topic", 4, 4)});
  // `mtpc plan examples/00_tiny.mtp`: "240856 gradient values".
  EXPECT_EQ(m.numParameters(), 240856);
}

TEST(Contract, ParametersOfADecoderHead) {
  // test/tools/contract.test's spec: 2 layers, hidden 32, 4 heads, ffn 64,
  // vocab 100, seq 16; a decoder(layers = 2, vocab = 50, target_seq = 8).
  ModelConfig c;
  c.layers = 2, c.hidden = 32, c.heads = 4, c.ffn = 64, c.vocab = 100;
  c.seq = 16;
  HeadConfig mt = decoderHead("mt", 2, 50, 8);
  mt.decoderLayers = 2;
  Model m(c, {mt});
  // `mtpc plan` on that spec: "50162 gradient values".
  EXPECT_EQ(m.numParameters(), 50162);
}

} // namespace
