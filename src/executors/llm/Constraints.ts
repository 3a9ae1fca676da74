/**
 * Structured output in the LLM executor: a request's `response_format` (or the schema of the tool
 * call it must make) held to by masking the logits at each step (`structured/`). A worker builds
 * its tokenizer's vocabulary index once, at the first constrained request, and compiles each
 * schema once; the router compiles it too, so that a schema the decoder cannot hold to is the
 * request's 400 before anything runs.
 */
import { GenerationConfig } from "../../models/GenerationConfig.js"
import type { ModelDirectory } from "../../models/ModelDirectory.js"
import { ConstrainedDecoder } from "./structured/ConstrainedDecoder.js"
import { compileGrammar, type Grammar, type ResponseFormat, UnsupportedSchema } from "./structured/JsonGrammar.js"
import { TokenVocabulary, tokenBytes } from "./structured/TokenVocabulary.js"

export type { ResponseFormat } from "./structured/JsonGrammar.js"

/** Compiled grammars kept per worker and router, at most. */
const keptGrammars = 64

export class Constraints {
  private vocabulary: TokenVocabulary | undefined
  private readonly grammars = new Map<string, Grammar>()

  constructor(
    private readonly model: ModelDirectory,
    /** The width of the model's logits rows. */
    private readonly vocabSize: number
  ) {}

  /** The grammar of a format, compiled once; throws UnsupportedSchema for a schema it cannot hold to. */
  grammar(format: ResponseFormat): Grammar {
    const key = JSON.stringify(format)
    const kept = this.grammars.get(key)
    if (kept !== undefined) {
      // Most recently used last.
      this.grammars.delete(key)
      this.grammars.set(key, kept)
      return kept
    }
    const grammar = compileGrammar(format)
    this.grammars.set(key, grammar)
    if (this.grammars.size > keptGrammars) this.grammars.delete(this.grammars.keys().next().value!)
    return grammar
  }

  /** A decoder for one request under `format`. */
  decoder(format: ResponseFormat): ConstrainedDecoder {
    return new ConstrainedDecoder(this.grammar(format), this.tokens())
  }

  private tokens(): TokenVocabulary {
    if (this.vocabulary === undefined) {
      const json = this.model.tokenizer?.json
      if (json === undefined)
        throw new Error(`${this.model.path} has no tokenizer.json: it cannot decode under a schema`)
      this.vocabulary = new TokenVocabulary(
        tokenBytes(json as Record<string, unknown>),
        GenerationConfig.of(this.model).eosTokenIds,
        { size: this.vocabSize }
      )
    }
    return this.vocabulary
  }
}

export { UnsupportedSchema }
