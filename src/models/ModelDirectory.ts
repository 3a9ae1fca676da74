import * as Either from "effect/Either"
import * as ParseResult from "effect/ParseResult"
import * as Schema from "effect/Schema"
import { readdir, readFile, stat } from "node:fs/promises"
import { join, resolve } from "node:path"

/**
 * Reads a model directory laid out like the ONNX exports the Hugging Face community publishes for
 * transformers.js: config.json, optional generation_config.json, preprocessor_config.json,
 * tokenizer.json and tokenizer_config.json, and onnx/*.onnx. Built-in models and a user's own
 * directory go through this same code; the fields the platform relies on are decoded here, at the
 * edge, so executors can trust them.
 */

export class InvalidModelDirectory extends Schema.TaggedError<InvalidModelDirectory>()("InvalidModelDirectory", {
  path: Schema.String,
  reason: Schema.String
}) {
  override get message() {
    return `invalid model directory ${this.path}: ${this.reason}`
  }
}

const Count = Schema.Int.pipe(Schema.positive())
const TokenId = Schema.Int.pipe(Schema.nonNegative())

/** The decoder fields of a config (under text_config for multimodal models, at the top otherwise). */
export const DecoderConfig = Schema.Struct({
  hidden_size: Count,
  num_hidden_layers: Count,
  num_attention_heads: Count,
  num_key_value_heads: Schema.optional(Count),
  head_dim: Schema.optional(Count),
  vocab_size: Count,
  max_position_embeddings: Schema.optional(Count)
})
export type DecoderConfig = typeof DecoderConfig.Type

/** What a generator executor needs to run onnx/generator.onnx. */
export const GeneratorConfig = Schema.Union(
  Schema.Struct({ modality: Schema.Literal("image"), height: Count, width: Count }),
  Schema.Struct({
    modality: Schema.Literal("audio"),
    sample_rate: Count,
    chunk_size: Count,
    default_num_chunks: Count,
    sample_format: Schema.Literal("pcm16")
  })
)
export type GeneratorConfig = typeof GeneratorConfig.Type

/** Which model's embeddings a generator consumes, and which output of it. */
export const PromptEmbeddingsConfig = Schema.Struct({
  model: Schema.String,
  source: Schema.Literal("embed_tokens"),
  hidden_size: Count
})

export const ModelConfig = Schema.Struct({
  model_type: Schema.String,
  text_config: Schema.optional(Schema.Object),
  image_token_id: Schema.optional(TokenId),
  image_seq_length: Schema.optional(Count),
  video_token_id: Schema.optional(TokenId),
  audio_token_id: Schema.optional(TokenId),
  audio_seq_length: Schema.optional(Count),
  eos_token_id: Schema.optional(Schema.NullOr(Schema.Union(TokenId, Schema.Array(TokenId)))),
  pad_token_id: Schema.optional(Schema.NullOr(TokenId)),
  generator: Schema.optional(GeneratorConfig),
  prompt_embeddings: Schema.optional(PromptEmbeddingsConfig),
  cornserve: Schema.optional(Schema.Struct({ recipe: Schema.String, version: Schema.Int }))
})
export type ModelConfig = typeof ModelConfig.Type

const ChatTemplate = Schema.Union(
  Schema.String,
  Schema.Array(Schema.Struct({ name: Schema.String, template: Schema.String }))
)

export const TokenizerConfig = Schema.Struct({
  chat_template: Schema.optional(ChatTemplate),
  eos_token: Schema.optional(Schema.NullOr(Schema.Union(Schema.String, Schema.Struct({ content: Schema.String })))),
  bos_token: Schema.optional(Schema.NullOr(Schema.Union(Schema.String, Schema.Struct({ content: Schema.String }))))
})
export type TokenizerConfig = typeof TokenizerConfig.Type

/** A decoder's cache geometry, as an LLM executor needs it to make an empty past. */
export interface DecoderSpec {
  readonly hiddenSize: number
  readonly layers: number
  /** Query heads. */
  readonly heads: number
  readonly keyValueHeads: number
  readonly headDim: number
  readonly vocabSize: number
  readonly maxPositions: number | undefined
  /** The positions each attends within, where the model's attention is windowed. */
  readonly slidingWindow: number | undefined
  /** The first token's position: 1 for Gemma 3 and PaliGemma, whose exports transformers.js feeds so, else 0. */
  readonly firstPosition: 0 | 1
}

/** Model types whose position_ids count from 1 (transformers.js's `create_position_ids` start index). */
const countsFromOne = new Set(["gemma3", "gemma3_text", "paligemma"])

/**
 * Gemma 3's text_config as Google writes it holds only what differs from Gemma3TextConfig's
 * defaults (no vocab_size, no head counts): those defaults, under what the config gives.
 */
const gemma3TextDefaults = {
  vocab_size: 262208,
  num_attention_heads: 8,
  num_key_value_heads: 4,
  head_dim: 256,
  max_position_embeddings: 131072,
  sliding_window: 4096
}

export interface ModelDirectory {
  readonly path: string
  readonly config: ModelConfig
  /** All of config.json, for model-specific fields. */
  readonly rawConfig: Readonly<Record<string, unknown>>
  readonly decoder: DecoderSpec | undefined
  readonly generationConfig: Readonly<Record<string, unknown>> | undefined
  readonly preprocessorConfig: Readonly<Record<string, unknown>> | undefined
  /** processor_config.json: what a multimodal processor adds (Idefics3's image_seq_len). */
  readonly processorConfig: Readonly<Record<string, unknown>> | undefined
  readonly tokenizer:
    | {
        readonly json: Readonly<Record<string, unknown>>
        /** All of tokenizer_config.json, as tokenizers.js takes it. */
        readonly rawConfig: Readonly<Record<string, unknown>>
        readonly config: TokenizerConfig
      }
    | undefined
  /** Absolute paths of onnx/*.onnx by file name without extension ("decoder_model_merged"). */
  readonly onnx: ReadonlyMap<string, string>
}

/** Decodes a config value, or says which fields are wrong and why. */
export const decodeConfig = <A, I>(schema: Schema.Schema<A, I>, value: unknown): Either.Either<A, string> =>
  Either.mapLeft(Schema.decodeUnknownEither(schema)(value, { errors: "all" }), (error) =>
    ParseResult.TreeFormatter.formatErrorSync(error)
  )

const decodeModelFile = <A, I>(schema: Schema.Schema<A, I>, value: unknown, path: string, what: string): A =>
  Either.getOrThrowWith(
    decodeConfig(schema, value),
    (reason) => new InvalidModelDirectory({ path, reason: `${what}: ${reason}` })
  )

const isMissing = (error: unknown) => (error as NodeJS.ErrnoException).code === "ENOENT"

const readJsonObject = async (
  dir: string,
  file: string,
  required: boolean
): Promise<Record<string, unknown> | undefined> => {
  let text: string
  try {
    text = await readFile(join(dir, file), "utf8")
  } catch (error) {
    if (isMissing(error) && !required) return undefined
    throw new InvalidModelDirectory({
      path: dir,
      reason: isMissing(error) ? `${file} is missing` : `cannot read ${file}: ${(error as Error).message}`
    })
  }
  let value: unknown
  try {
    value = JSON.parse(text)
  } catch (error) {
    throw new InvalidModelDirectory({ path: dir, reason: `${file} is not valid JSON: ${(error as Error).message}` })
  }
  if (typeof value !== "object" || value === null || Array.isArray(value)) {
    throw new InvalidModelDirectory({ path: dir, reason: `${file} must hold a JSON object` })
  }
  return value as Record<string, unknown>
}

/**
 * A config describes a decoder-only language model when it (or its text_config) gives a
 * vocab_size; an encoder-decoder's (Whisper's) describes its own layers, read by its own reader.
 */
const decoderSpec = (config: Readonly<Record<string, unknown>>, path: string): DecoderSpec | undefined => {
  const given = (config.text_config ?? config) as Record<string, unknown>
  const section = given.model_type === "gemma3_text" ? { ...gemma3TextDefaults, ...given } : given
  if (section.vocab_size === undefined || config.is_encoder_decoder === true) return undefined
  const decoder = decodeModelFile(DecoderConfig, section, path, "config.json (decoder fields)")
  return {
    hiddenSize: decoder.hidden_size,
    layers: decoder.num_hidden_layers,
    heads: decoder.num_attention_heads,
    keyValueHeads: decoder.num_key_value_heads ?? decoder.num_attention_heads,
    headDim: decoder.head_dim ?? decoder.hidden_size / decoder.num_attention_heads,
    vocabSize: decoder.vocab_size,
    maxPositions: decoder.max_position_embeddings,
    slidingWindow:
      typeof section.sliding_window === "number" && section.use_sliding_window !== false
        ? section.sliding_window
        : undefined,
    firstPosition: countsFromOne.has(String(config.model_type)) ? 1 : 0
  }
}

const onnxFiles = async (dir: string): Promise<ReadonlyMap<string, string>> => {
  let entries: Array<string>
  try {
    entries = await readdir(join(dir, "onnx"))
  } catch (error) {
    if (isMissing(error)) throw new InvalidModelDirectory({ path: dir, reason: "it has no onnx/ folder" })
    throw error
  }
  const models = entries.filter((entry) => entry.endsWith(".onnx")).sort()
  if (models.length === 0) throw new InvalidModelDirectory({ path: dir, reason: "onnx/ holds no .onnx file" })
  return new Map(models.map((file) => [file.slice(0, -".onnx".length), join(dir, "onnx", file)]))
}

export const loadModelDirectory = async (dir: string): Promise<ModelDirectory> => {
  const path = resolve(dir)
  const info = await stat(path).catch((error: unknown) => {
    throw new InvalidModelDirectory({ path, reason: isMissing(error) ? "it does not exist" : String(error) })
  })
  if (!info.isDirectory()) throw new InvalidModelDirectory({ path, reason: "it is not a directory" })

  const rawConfig = (await readJsonObject(path, "config.json", true))!
  // Gemma 3 and LLaVA-style configs name the image token image_token_index, which transformers.js reads too.
  const config = decodeModelFile(
    ModelConfig,
    { ...rawConfig, image_token_id: rawConfig.image_token_id ?? rawConfig.image_token_index },
    path,
    "config.json"
  )
  const tokenizerJson = await readJsonObject(path, "tokenizer.json", false)
  const tokenizerConfigJson = await readJsonObject(path, "tokenizer_config.json", false)
  if (tokenizerJson === undefined && tokenizerConfigJson !== undefined) {
    throw new InvalidModelDirectory({ path, reason: "tokenizer_config.json is there but tokenizer.json is missing" })
  }
  return {
    path,
    config,
    rawConfig,
    decoder: decoderSpec(rawConfig, path),
    generationConfig: await readJsonObject(path, "generation_config.json", false),
    preprocessorConfig: await readJsonObject(path, "preprocessor_config.json", false),
    processorConfig: await readJsonObject(path, "processor_config.json", false),
    tokenizer:
      tokenizerJson === undefined
        ? undefined
        : {
            json: tokenizerJson,
            rawConfig: tokenizerConfigJson ?? {},
            config: decodeModelFile(TokenizerConfig, tokenizerConfigJson ?? {}, path, "tokenizer_config.json")
          },
    onnx: await onnxFiles(path)
  }
}

/** The path of onnx/<stem>.onnx, or a clear error naming what the directory does hold. */
export const onnxPath = (model: ModelDirectory, stem: string): string => {
  const path = model.onnx.get(stem)
  if (path === undefined) {
    throw new InvalidModelDirectory({
      path: model.path,
      reason: `it has no onnx/${stem}.onnx (it has ${[...model.onnx.keys()].map((s) => `${s}.onnx`).join(", ")})`
    })
  }
  return path
}
