import * as Either from "effect/Either"
import * as Schema from "effect/Schema"
import { type Dtype, dtypePreference, onnxFileName } from "./Dtype.js"
import { GenerationConfig } from "./GenerationConfig.js"
import { DecoderConfig, decodeConfig, InvalidModelDirectory, type ModelDirectory } from "./ModelDirectory.js"

/**
 * DeepSeek's Janus-Pro in the community's ONNX layout (config.json's model_type "multi_modality",
 * the six graphs described in architectures/Janus.ts): what the platform reads of it to generate
 * image tokens (the LLM executor) and to decode them to pixels (Geri), the way transformers.js's
 * MultiModalityCausalLM.generate_images reads it.
 */

/** Whether a model directory is a Janus (multi_modality) model. */
export const isJanus = (model: ModelDirectory): boolean => model.config.model_type === "multi_modality"

const Count = Schema.Int.pipe(Schema.positive())

/** Pixels a side of one image token in Janus's VQ-16 decoder. */
const vqPatchSize = 16

const JanusConfigJson = Schema.Struct({
  language_config: DecoderConfig,
  gen_head_config: Schema.Struct({ params: Schema.Struct({ image_token_size: Count }) })
})

const JanusProcessorJson = Schema.Struct({
  num_image_tokens: Count,
  image_tag: Schema.String,
  image_start_tag: Schema.String
})

const JanusGenerationJson = Schema.Struct({
  guidance_scale: Schema.optional(Schema.NullOr(Schema.Number))
})

export interface JanusSpec {
  /** The language model's cache geometry (config.json's language_config). */
  readonly layers: number
  readonly kvHeads: number
  readonly headDim: number
  readonly hiddenSize: number
  readonly vocabSize: number
  readonly maxPositions: number | undefined
  /** Image tokens the generation head chooses among (the codebook). */
  readonly codebookSize: number
  /** Image tokens of one image: what image_decode takes. */
  readonly imageTokens: number
  /** The side of the images image_decode paints: VQ-16's tokens are 16 × 16 pixels on a square grid. */
  readonly imageSide: number
  /** The processor's image placeholder: a prompt for an image holds none. */
  readonly imageTag: string
  /**
   * generation_config.json's guidance_scale: above 1, each image token is chosen with
   * classifier-free guidance over a conditional and an unconditional row; otherwise from the
   * prompt's row alone, as transformers.js does.
   */
  readonly guidanceScale: number | undefined
  /** The unconditional row's prompt is all this token. */
  readonly padTokenId: number
  /** Masked to -Infinity in the conditional row's logits until the image is whole (min_new_tokens), where the codebook reaches it. */
  readonly eosTokenIds: ReadonlyArray<number>
}

const decodeFile = <A, I>(model: ModelDirectory, schema: Schema.Schema<A, I>, value: unknown, file: string): A =>
  Either.getOrThrowWith(
    decodeConfig(schema, value ?? {}),
    (reason) => new InvalidModelDirectory({ path: model.path, reason: `${file} (Janus fields): ${reason}` })
  )

/** The Janus fields of a model directory, checked: an invalid model directory names what is wrong. */
export const janusSpec = (model: ModelDirectory): JanusSpec => {
  const config = decodeFile(model, JanusConfigJson, model.rawConfig, "config.json")
  const processor = decodeFile(model, JanusProcessorJson, model.processorConfig, "processor_config.json")
  const generation = decodeFile(model, JanusGenerationJson, model.generationConfig, "generation_config.json")
  const tokens = GenerationConfig.of(model)
  const padTokenId = tokens.padTokenId
  if (padTokenId === undefined)
    throw new InvalidModelDirectory({
      path: model.path,
      reason: "generation_config.json names no pad_token_id, which the unconditional row is made of"
    })
  const language = config.language_config
  const gridSide = Math.round(Math.sqrt(processor.num_image_tokens))
  if (gridSide * gridSide !== processor.num_image_tokens)
    throw new InvalidModelDirectory({
      path: model.path,
      reason: `processor_config.json: num_image_tokens ${processor.num_image_tokens} is not a square grid`
    })
  return {
    layers: language.num_hidden_layers,
    kvHeads: language.num_key_value_heads ?? language.num_attention_heads,
    headDim: language.head_dim ?? language.hidden_size / language.num_attention_heads,
    hiddenSize: language.hidden_size,
    vocabSize: language.vocab_size,
    maxPositions: language.max_position_embeddings,
    codebookSize: config.gen_head_config.params.image_token_size,
    imageTokens: processor.num_image_tokens,
    imageSide: gridSide * vqPatchSize,
    imageTag: processor.image_tag,
    guidanceScale: generation.guidance_scale ?? undefined,
    padTokenId,
    eosTokenIds: tokens.eosTokenIds
  }
}

/** Whether image tokens are chosen with classifier-free guidance (two rows) at this scale. */
export const isGuided = (guidanceScale: number | undefined): guidanceScale is number =>
  guidanceScale !== undefined && guidanceScale > 1

/**
 * onnx/<stem>.onnx at `dtype` when the directory has it, else at the dtype that loses the least
 * precision among those it has (an export may keep a graph in fewer dtypes than the others).
 */
export const janusGraphPath = (model: ModelDirectory, stem: string, dtype: Dtype | undefined): string => {
  const order = dtype === undefined ? dtypePreference : [dtype, ...dtypePreference]
  for (const candidate of order) {
    const path = model.onnx.get(onnxFileName(stem, candidate).slice(0, -".onnx".length))
    if (path !== undefined) return path
  }
  throw new InvalidModelDirectory({
    path: model.path,
    reason: `it is a Janus model without onnx/${stem}.onnx in any dtype (it has ${[...model.onnx.keys()].map((name) => `${name}.onnx`).join(", ")})`
  })
}

/** The user's role in Janus's conversations (VLChatProcessor's "deepseek" format). */
export const janusUserRole = "<|User|>"
