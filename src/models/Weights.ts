/**
 * Weights of the layers the models are made of. A recipe produces them (by formula or seeded random
 * numbers); the ONNX graph builders (src/models/onnx, src/models/architectures) write them into a
 * model file and the float64 references (src/models/reference) compute with the very same values.
 */

/** A row-major matrix of float32 values. */
export interface Matrix {
  readonly rows: number
  readonly cols: number
  readonly data: Float32Array
}

/** y = x · weight + bias, with `weight` stored [in, out] so that the graph needs no transpose. */
export interface LinearWeights {
  readonly weight: Matrix
  readonly bias?: Float32Array
}

export interface LayerNormWeights {
  readonly gamma: Float32Array
  readonly beta: Float32Array
  readonly epsilon: number
}

export interface AttentionWeights {
  readonly heads: number
  readonly query: LinearWeights
  readonly key: LinearWeights
  readonly value: LinearWeights
  readonly output: LinearWeights
}

/** down(GELU(up(x))). */
export interface MlpWeights {
  readonly up: LinearWeights
  readonly down: LinearWeights
}

/** A pre-norm transformer block: x + attention(norm1(x)), then x + mlp(norm2(x)). */
export interface TransformerBlockWeights {
  readonly norm1: LayerNormWeights
  readonly attention: AttentionWeights
  readonly norm2: LayerNormWeights
  readonly mlp: MlpWeights
}

/** A Conv with kernel = stride = patch size, giving one `hidden`-wide row per patch. */
export interface PatchEmbeddingWeights {
  readonly channels: number
  readonly hidden: number
  readonly patchSize: number
  /** [hidden, channels, patchSize, patchSize], the layout of a Conv kernel. */
  readonly kernel: Float32Array
  readonly bias: Float32Array
}

/** A decoder-only language model with learned absolute positions (GPT-2 layout). */
export interface DecoderWeights {
  /** [vocab, hidden]: what embed_tokens.onnx looks up. */
  readonly embedTokens: Matrix
  /** [maxPositions, hidden], added to inputs_embeds at position_ids. */
  readonly positions: Matrix
  readonly layers: ReadonlyArray<TransformerBlockWeights>
  readonly finalNorm: LayerNormWeights
  /** [hidden, vocab], no bias. */
  readonly lmHead: Matrix
}

/** A ViT image encoder: patch embedding, class token, learned positions, blocks, final norm. */
export interface VisionTransformerWeights {
  readonly imageSize: number
  readonly patch: PatchEmbeddingWeights
  readonly classToken: Float32Array
  /** [1 + patches, hidden]. */
  readonly positions: Matrix
  readonly layers: ReadonlyArray<TransformerBlockWeights>
  readonly finalNorm: LayerNormWeights
}

export const matrix = (rows: number, cols: number, data: Float32Array = new Float32Array(rows * cols)): Matrix => {
  if (data.length !== rows * cols)
    throw new Error(`a ${rows}×${cols} matrix needs ${rows * cols} values, got ${data.length}`)
  return { rows, cols, data }
}
