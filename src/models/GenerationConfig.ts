import * as Either from "effect/Either"
import * as Schema from "effect/Schema"
import { decodeConfig, InvalidModelDirectory, type ModelDirectory } from "./ModelDirectory.js"

/**
 * A model's generation settings. Its special token ids are merged the way transformers.js prepares
 * a generation config: config.json with its `decoder`, `generator` and `text_config` sections
 * lifted to the top, then every id generation_config.json gives. Sampling and length defaults come
 * from generation_config.json alone: older config.json files carry transformers' former built-in
 * defaults (`max_length: 20`, `do_sample: false`), which no one chose for the model.
 */

const TokenId = Schema.Int.pipe(Schema.nonNegative())
const TokenIds = Schema.NullOr(Schema.Union(TokenId, Schema.Array(TokenId)))
/** Ids the platform does not act on: any integer, as some exports write -1. */
const AnyId = Schema.NullOr(Schema.Int)

/** The special token ids of generation_config.json and config.json. */
const TokenFields = Schema.Struct({
  eos_token_id: Schema.optional(TokenIds),
  bos_token_id: Schema.optional(AnyId),
  pad_token_id: Schema.optional(AnyId)
})

/** The fields of generation_config.json the platform honours; the rest are ignored. */
export const GenerationFields = Schema.Struct({
  ...TokenFields.fields,
  do_sample: Schema.optional(Schema.NullOr(Schema.Boolean)),
  temperature: Schema.optional(Schema.NullOr(Schema.Number.pipe(Schema.nonNegative()))),
  top_p: Schema.optional(Schema.NullOr(Schema.Number.pipe(Schema.between(0, 1)))),
  top_k: Schema.optional(Schema.NullOr(Schema.Int.pipe(Schema.nonNegative()))),
  repetition_penalty: Schema.optional(Schema.NullOr(Schema.Number.pipe(Schema.positive()))),
  max_new_tokens: Schema.optional(Schema.NullOr(Schema.Int.pipe(Schema.positive()))),
  max_length: Schema.optional(Schema.NullOr(Schema.Int.pipe(Schema.positive())))
})
export type GenerationFields = typeof GenerationFields.Type

/** What a request that leaves a sampling field out gets. */
export interface SamplingDefaults {
  /** 0 (greedy) when the model says `do_sample: false`. */
  readonly temperature: number
  readonly topP: number
  /** 0: no top-k cut. */
  readonly topK: number
  /** 1: no penalty. */
  readonly repetitionPenalty: number
}

export class GenerationConfig {
  private constructor(private readonly fields: GenerationFields) {}

  /** The model's merged generation config; a field of the wrong type is an invalid model directory. */
  static of(model: ModelDirectory): GenerationConfig {
    const config: Record<string, unknown> = { ...model.rawConfig }
    for (const section of ["decoder", "generator", "text_config"]) {
      const value = config[section]
      if (typeof value === "object" && value !== null) Object.assign(config, value)
    }
    const decode = <A, I>(schema: Schema.Schema<A, I>, value: unknown, file: string) =>
      Either.getOrThrowWith(
        decodeConfig(schema, value),
        (reason) => new InvalidModelDirectory({ path: model.path, reason: `${file}: ${reason}` })
      )
    return new GenerationConfig({
      ...decode(TokenFields, pick(config), "config.json (special token ids)"),
      ...decode(GenerationFields, model.generationConfig ?? {}, "generation_config.json")
    })
  }

  /** The tokens that end a sequence: generation_config.json's eos_token_id, else config.json's. */
  get eosTokenIds(): ReadonlyArray<number> {
    const ids = this.fields.eos_token_id
    return ids === undefined || ids === null ? [] : typeof ids === "number" ? [ids] : [...new Set(ids)]
  }

  get bosTokenId(): number | undefined {
    return this.fields.bos_token_id ?? undefined
  }

  get padTokenId(): number | undefined {
    return this.fields.pad_token_id ?? undefined
  }

  /**
   * Sampling defaults for an OpenAI-style request: a field the model's config gives is the
   * default (as vLLM takes generation_config.json); one it leaves out turns its step off, so
   * `top_k` is not transformers' built-in 50, which only its own generate() applies.
   */
  get sampling(): SamplingDefaults {
    const { do_sample, temperature, top_p, top_k, repetition_penalty } = this.fields
    return {
      temperature: do_sample === false ? 0 : (temperature ?? 1),
      topP: top_p ?? 1,
      topK: top_k ?? 0,
      repetitionPenalty: repetition_penalty ?? 1
    }
  }

  /**
   * How many tokens a request that names no limit may generate after `promptTokens`: the model's
   * max_new_tokens, else what its max_length leaves (at least one, as generate() always takes a
   * step), else undefined (up to the context length).
   */
  maxNewTokens(promptTokens: number): number | undefined {
    const { max_new_tokens, max_length } = this.fields
    if (max_new_tokens !== undefined && max_new_tokens !== null) return max_new_tokens
    if (max_length !== undefined && max_length !== null) return Math.max(1, max_length - promptTokens)
    return undefined
  }
}

/** The token id fields of a config.json, so that its other fields (of other types) are not checked. */
const pick = (config: Readonly<Record<string, unknown>>): Record<string, unknown> =>
  Object.fromEntries(Object.keys(TokenFields.fields).flatMap((key) => (key in config ? [[key, config[key]]] : [])))
