//===- MTPAttrs.td - mtp enums and attributes --------------*- tablegen -*-===//

#ifndef MTP_ATTRS
#define MTP_ATTRS

include "dialect/MTPDialect.td"
include "mlir/IR/EnumAttr.td"

def MTP_BackboneKind : I32EnumAttr<"BackboneKind", "kind of shared backbone", [
    I32EnumAttrCase<"transformer", 0>
  ]> {
  let cppNamespace = "::mtp";
  let genSpecializedAttr = 0;
}
def MTP_BackboneKindAttr : EnumAttr<MTP_Dialect, MTP_BackboneKind, "backbone">;

def MTP_HeadKind : I32EnumAttr<"HeadKind", "kind of task head", [
    // Sequence classification on the pooled (first-token) output.
    I32EnumAttrCase<"classify", 0>,
    // Per-token tagging (NER, POS, chunking).
    I32EnumAttrCase<"tag", 1>,
    // Span extraction: start/end logits per token (SQuAD).
    I32EnumAttrCase<"span", 2>,
    // A small decoder for generation, cross-attending to the tap.
    I32EnumAttrCase<"decoder", 3>
  ]> {
  let cppNamespace = "::mtp";
  let genSpecializedAttr = 0;
}
def MTP_HeadKindAttr : EnumAttr<MTP_Dialect, MTP_HeadKind, "head">;

def MTP_LossKind : I32EnumAttr<"LossKind", "task loss", [
    I32EnumAttrCase<"cross_entropy", 0>,
    I32EnumAttrCase<"mse", 1>
  ]> {
  let cppNamespace = "::mtp";
  let genSpecializedAttr = 0;
}
def MTP_LossKindAttr : EnumAttr<MTP_Dialect, MTP_LossKind, "loss">;

def MTP_Precision : I32EnumAttr<"Precision", "training precision", [
    I32EnumAttrCase<"fp32", 0>,
    // bf16 autocast with fp32 master weights.
    I32EnumAttrCase<"bf16", 1>,
    // fp16 with loss scaling (GPU only).
    I32EnumAttrCase<"fp16", 2>
  ]> {
  let cppNamespace = "::mtp";
  let genSpecializedAttr = 0;
}
def MTP_PrecisionAttr : EnumAttr<MTP_Dialect, MTP_Precision, "precision">;

#endif // MTP_ATTRS
