import * as Either from "effect/Either"
import * as Schema from "effect/Schema"
import { DecoderConfig, decodeConfig, InvalidModelDirectory, type ModelDirectory, onnxPath } from "./ModelDirectory.js"

/**
 * A talker model directory (config.json's model_type "cornserve_talker", the four graphs of
 * architectures/Talker.ts): what the LLM executor reads of it to write codec frames from another
 * LLM's hidden states.
 */

export const talkerModelType = "cornserve_talker"

/** Whether a model directory is a talker. */
export const isTalker = (model: ModelDirectory): boolean => model.config.model_type === talkerModelType

const Count = Schema.Int.pipe(Schema.positive())

const TalkerConfigJson = Schema.Struct({
  ...DecoderConfig.fields,
  talker: Schema.Struct({
    /** Codebooks of a frame (what the codec decodes) and codes of each. */
    num_code_groups: Count.pipe(Schema.greaterThanOrEqualTo(2)),
    codebook_size: Count,
    /** The thinker's hidden size: thinker_projection's input. */
    thinker_hidden_size: Count,
    /** The codec the frames are for, and its frame rate. */
    codec_model: Schema.optional(Schema.String),
    frame_rate: Schema.Number.pipe(Schema.positive()),
    /** Frames a request writes when it does not say. */
    default_max_frames: Count,
    /** The thinker whose hidden states it was made for. */
    thinker_model: Schema.optional(Schema.String)
  })
})

export interface TalkerSpec {
  readonly layers: number
  readonly kvHeads: number
  readonly headDim: number
  readonly hiddenSize: number
  readonly maxPositions: number | undefined
  readonly codebooks: number
  readonly codebookSize: number
  /** The first codebook's rows: its codes, then the begin and the end of speech. */
  readonly beginCode: number
  readonly endCode: number
  readonly thinkerHiddenSize: number
  readonly frameRate: number
  readonly defaultMaxFrames: number
  readonly codecModel: string | undefined
  readonly thinkerModel: string | undefined
}

/** The talker fields of a model directory, checked: an invalid model directory names what is wrong. */
export const talkerSpec = (model: ModelDirectory): TalkerSpec => {
  const config = Either.getOrThrowWith(
    decodeConfig(TalkerConfigJson, model.rawConfig),
    (reason) => new InvalidModelDirectory({ path: model.path, reason: `config.json (talker fields): ${reason}` })
  )
  const { talker } = config
  if (config.vocab_size !== talker.codebook_size + 2)
    throw new InvalidModelDirectory({
      path: model.path,
      reason: `config.json: vocab_size ${config.vocab_size} is not the first codebook's ${talker.codebook_size} codes and its two specials`
    })
  return {
    layers: config.num_hidden_layers,
    kvHeads: config.num_key_value_heads ?? config.num_attention_heads,
    headDim: config.head_dim ?? config.hidden_size / config.num_attention_heads,
    hiddenSize: config.hidden_size,
    maxPositions: config.max_position_embeddings,
    codebooks: talker.num_code_groups,
    codebookSize: talker.codebook_size,
    beginCode: talker.codebook_size,
    endCode: talker.codebook_size + 1,
    thinkerHiddenSize: talker.thinker_hidden_size,
    frameRate: talker.frame_rate,
    defaultMaxFrames: talker.default_max_frames,
    codecModel: talker.codec_model,
    thinkerModel: talker.thinker_model
  }
}

/** The talker's graphs, each checked to be there. */
export const talkerGraphPaths = (model: ModelDirectory) => ({
  projection: onnxPath(model, "thinker_projection"),
  decoder: onnxPath(model, "decoder_model_merged"),
  predictor: onnxPath(model, "code_predictor"),
  embed: onnxPath(model, "codec_embed")
})
