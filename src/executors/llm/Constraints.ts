/**
 * Structured output in the LLM executor: a request's `response_format` (or the schema of the tool
 * call it must make) held to by masking the logits at each step (`structured/`). A worker builds
 * its tokenizer's vocabulary index once, at the first constrained request (built when it loads,
 * the index would cost every LLM executor's start seconds of CPU on a large vocabulary, whether or
 * not a request ever asks for a schema), and compiles each schema once; the router checks each request's schema first (`check`, in its threads), so that a
 * schema the decoder cannot hold to is the request's 400 before anything runs.
 */
import { GenerationConfig } from "../../models/GenerationConfig.js"
import type { ModelDirectory } from "../../models/ModelDirectory.js"
import { ConstrainedDecoder } from "./structured/ConstrainedDecoder.js"
import { type Grammar, type ResponseFormat, UnsupportedSchema } from "./structured/GrammarNodes.js"
import { compileGrammar } from "./structured/JsonGrammar.js"
import { missingBytes, TokenVocabulary, tokenBytes, UnspelledBytes } from "./structured/TokenVocabulary.js"

export type { ResponseFormat } from "./structured/GrammarNodes.js"
export { SchemaTooLarge } from "./structured/SchemaBounds.js"

/** Compiled grammars kept per worker and router, at most. */
const keptGrammars = 64

/** Vocabulary indexes by model and logits width, one per process. */
const vocabularies = new Map<string, TokenVocabulary>()

export class Constraints {
  private unspelled: ReadonlyArray<number> | undefined
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

  /**
   * Throws what `decoder(format)` would (UnsupportedSchema, SchemaTooLarge, UnspelledBytes)
   * without indexing the vocabulary: the router's check of a request.
   */
  check(format: ResponseFormat): void {
    this.grammar(format)
    this.unspelled ??= missingBytes(tokenBytes(this.tokenizerJson()), GenerationConfig.of(this.model).eosTokenIds)
    if (this.unspelled.length > 0) throw new UnspelledBytes({ bytes: this.unspelled })
  }

  private tokens(): TokenVocabulary {
    const key = `${this.model.path}\0${this.vocabSize}`
    let vocabulary = vocabularies.get(key)
    if (vocabulary === undefined) {
      vocabulary = new TokenVocabulary(tokenBytes(this.tokenizerJson()), GenerationConfig.of(this.model).eosTokenIds, {
        size: this.vocabSize
      })
      vocabularies.set(key, vocabulary)
    }
    return vocabulary
  }

  private tokenizerJson(): Record<string, unknown> {
    const json = this.model.tokenizer?.json
    if (json === undefined) throw new Error(`${this.model.path} has no tokenizer.json: it cannot decode under a schema`)
    return json as Record<string, unknown>
  }
}

export { UnspelledBytes, UnsupportedSchema }
