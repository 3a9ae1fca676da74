/**
 * The precisions the community publishes a model's ONNX files in, and the file each is saved as:
 * `onnx/<stem><suffix>.onnx` (transformers.js's naming: `model_q4.onnx` is `model` at `q4`).
 */

import type { ModelDtype } from "../app-runtime/schemas/ModelDtype.js"

export const dtypeSuffixes: Readonly<Record<ModelDtype, string>> = {
  fp32: "",
  fp16: "_fp16",
  q8: "_quantized",
  int8: "_int8",
  uint8: "_uint8",
  q4: "_q4",
  q4f16: "_q4f16",
  bnb4: "_bnb4"
}

export type Dtype = ModelDtype

export const dtypes = Object.keys(dtypeSuffixes) as ReadonlyArray<Dtype>

export const isDtype = (value: string): value is Dtype => Object.hasOwn(dtypeSuffixes, value)

/**
 * The order in which a missing fp32 is replaced: the least precision lost first (fp16 keeps the
 * most, then 8-bit, then 4-bit).
 */
export const dtypePreference: ReadonlyArray<Dtype> = ["fp32", "fp16", "q8", "int8", "uint8", "q4", "q4f16", "bnb4"]

/** The file name of `stem` at `dtype`, under onnx/: `onnxFileName("model", "q4")` is "model_q4.onnx". */
export const onnxFileName = (stem: string, dtype: Dtype): string => `${stem}${dtypeSuffixes[dtype]}.onnx`

/** The stem and dtype of an onnx/ file name, or undefined for a name no dtype explains. */
export const parseOnnxFileName = (file: string): { readonly stem: string; readonly dtype: Dtype } | undefined => {
  if (!file.endsWith(".onnx")) return undefined
  const base = file.slice(0, -".onnx".length)
  // Longest suffix first: "_q4f16" before "_q4" would not matter, but "_quantized" must not be read as fp32.
  for (const dtype of [...dtypes].sort((a, b) => dtypeSuffixes[b].length - dtypeSuffixes[a].length)) {
    const suffix = dtypeSuffixes[dtype]
    if (suffix !== "" && base.endsWith(suffix)) return { stem: base.slice(0, -suffix.length), dtype }
  }
  return { stem: base, dtype: "fp32" }
}
