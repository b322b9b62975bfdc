//===- mtprt-demo.cpp - a hand-written step program on the driver ---------===//
//
// What mtpc's generated `main` will look like: fill in a Program (model,
// heads, training settings, schedule) and hand the process to the driver.
// Used by the runtime's tests as a real executable; `--help` lists the flags.
//
//===----------------------------------------------------------------------===//

#include "mtprt/Driver.h"

int main(int argc, char **argv) {
  mtprt::Program p;
  p.name = "mtprt-demo";
  p.model.vocab = 32;
  p.model.seq = 8;
  p.model.layers = 2;
  p.model.hidden = 16;
  p.model.heads = 2;
  p.model.ffn = 32;
  p.model.dropout = 0.1; // exercises the RNG state a checkpoint restores
  mtprt::HeadConfig cls{"cls", mtprt::HeadKind::Classify, 1};
  cls.classes = 4;
  mtprt::HeadConfig tag{"tag", mtprt::HeadKind::Tag, 2};
  tag.classes = 6;
  mtprt::HeadConfig qa{"qa", mtprt::HeadKind::Span, 2};
  p.heads = {cls, tag, qa};
  p.train.backboneLr.lr = 3e-3;
  p.schedule.regions = {{1, 2}}; // layer 1 recomputed in backward
  p.batchSize = 8;
  p.steps = 20;
  return mtprt::runDriver(argc, argv, p);
}
