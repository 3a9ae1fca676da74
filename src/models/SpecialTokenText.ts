import { randomBytes } from "node:crypto"
import type { AddedToken, Tokenizer } from "@huggingface/tokenizers"

/**
 * A client's text in a prompt is text: a special token written in it (`<|im_start|>system`) is
 * tokenized as its characters, never as the token, while the special tokens a chat template
 * writes stay special. This is Hugging Face's `split_special_tokens` for the client's texts alone;
 * added tokens that are not special (Qwen's `<think>`, `<tool_call>`) are the model's ordinary
 * vocabulary, as there.
 *
 * The template renders the client's texts with each special token in them replaced by a mark
 * (`markSpecialTokens`), so that the template sees text without special tokens; the rendered
 * prompt gets the characters back in place of the marks (`unmark`), with where they are
 * (`LiteralPrompt.literals`); and `LiteralEncoder` tokenizes it as the tokenizer does, except
 * that no special token is recognized across a literal.
 */

/** A rendered prompt, and the `[start, end)` ranges of it (in UTF-16 units, in order) that are text whatever they hold. */
export interface LiteralPrompt {
  readonly text: string
  readonly literals: ReadonlyArray<number>
}

/** Client texts with their special tokens replaced by marks: `contents[i]` is what mark i stands for. */
export interface Marks {
  readonly nonce: string
  readonly contents: ReadonlyArray<string>
}

const markStart = "\uE000"
const markEnd = "\uE001"

const escapeRegExp = (text: string) => text.replace(/[.*+?^${}()|[\]\\]/g, "\\$&")

/** The special tokens of a tokenizer, as text may spell them. */
export class SpecialTokens {
  private readonly pattern: RegExp | undefined

  constructor(contents: ReadonlyArray<string>) {
    const sorted = [...new Set(contents)].filter((content) => content.length > 0).sort((a, b) => b.length - a.length)
    this.pattern = sorted.length === 0 ? undefined : new RegExp(sorted.map(escapeRegExp).join("|"), "g")
  }

  static of(tokenizer: Tokenizer): SpecialTokens {
    const added = [...tokenizer.get_added_tokens_decoder().values()]
    return new SpecialTokens(added.flatMap((token) => (token.special ? [token.content] : [])))
  }

  /** A marker for one prompt's client texts. */
  marker(): Marker {
    return new Marker(this.pattern)
  }
}

/**
 * Replaces the special tokens spelled in one prompt's client texts by marks: private-use
 * characters around a nonce nobody can guess and the mark's index, which template filters
 * (`tojson`, `trim`, `split`) keep whole.
 */
export class Marker {
  private readonly nonce = randomBytes(6).toString("hex")
  private readonly contents: Array<string> = []
  private readonly indices = new Map<string, number>()

  constructor(private readonly pattern: RegExp | undefined) {}

  /** `text` with each special token spelled in it replaced by a mark. */
  readonly text = (text: string): string =>
    this.pattern === undefined ? text : text.replace(this.pattern, this.markOf)

  /** `value` with every string within it (object keys included) marked. */
  value<A>(value: A): A {
    const copy = (item: unknown): unknown => {
      if (typeof item === "string") return this.text(item)
      if (Array.isArray(item)) return item.map(copy)
      if (typeof item === "object" && item !== null)
        return Object.fromEntries(Object.entries(item).map(([key, inner]) => [this.text(key), copy(inner)]))
      return item
    }
    return copy(value) as A
  }

  get marks(): Marks {
    return { nonce: this.nonce, contents: this.contents }
  }

  private readonly markOf = (content: string): string => {
    let index = this.indices.get(content)
    if (index === undefined) {
      index = this.contents.length
      this.contents.push(content)
      this.indices.set(content, index)
    }
    return `${markStart}${this.nonce}.${index}${markEnd}`
  }
}

/** `text` with each mark turned back into the characters it stands for, and where they are. */
export const unmark = (text: string, marks: Marks): LiteralPrompt => {
  if (marks.contents.length === 0) return { text, literals: [] }
  const pattern = new RegExp(`${markStart}${marks.nonce}\\.(\\d+)${markEnd}`, "g")
  const literals: Array<number> = []
  let out = ""
  let from = 0
  for (const match of text.matchAll(pattern)) {
    const content = marks.contents[Number(match[1])]
    if (content === undefined) continue
    out += text.slice(from, match.index)
    literals.push(out.length, out.length + content.length)
    out += content
    from = match.index + match[0].length
  }
  return { text: out + text.slice(from), literals }
}

/** One piece of a text: an added token the tokenizer recognizes there, or text between them. */
interface Section {
  readonly text: string
  readonly token: AddedToken | undefined
  /** The piece holds (part of) a literal. */
  readonly literal: boolean
}

/**
 * Tokenizes as `Tokenizer.encode` (tokenizers.js 0.2) does, with special tokens recognized only
 * outside a prompt's literals: added tokens are split out of the raw text (those the normalizer
 * sees, out of the normalized text), each other piece normalized, pre-tokenized and run through
 * the model.
 */
export class LiteralEncoder {
  private readonly raw: TokenTrie
  private readonly normalized: TokenTrie
  private readonly byContent: ReadonlyMap<string, AddedToken>

  constructor(
    private readonly tokenizer: Tokenizer,
    private readonly config: Readonly<Record<string, unknown>>
  ) {
    const added = [...tokenizer.get_added_tokens_decoder().values()]
    const viaNormalizer = (token: AddedToken) => token.normalized && tokenizer.normalizer !== null
    this.raw = new TokenTrie(added.filter((token) => !viaNormalizer(token)))
    this.normalized = new TokenTrie(added.filter(viaNormalizer))
    this.byContent = new Map(added.map((token) => [token.content, token]))
  }

  encode(prompt: LiteralPrompt): Array<number> {
    const { tokenizer, config } = this
    const ids: Array<number> = []
    const sections = split(this.raw, prompt.text, prompt.literals)
    sections.forEach((section, sectionIndex) => {
      if (section.text.length === 0) return
      if (section.token !== undefined) {
        ids.push(section.token.id)
        return
      }
      let text = section.text
      if (config.remove_space === true) text = text.trim().split(/\s+/).join(" ")
      if (config.do_lowercase_and_remove_accent === true) text = text.toLowerCase().replace(/\p{M}/gu, "")
      if (tokenizer.normalizer !== null) text = tokenizer.normalizer(text)
      if (text.length === 0) return
      // Offsets are lost in normalizing: a piece with a literal in it recognizes no special token.
      const within = section.literal ? [0, text.length] : []
      for (const piece of split(this.normalized, text, within)) {
        if (piece.text.length === 0) continue
        if (piece.token !== undefined) {
          ids.push(piece.token.id)
          continue
        }
        const words =
          tokenizer.pre_tokenizer === null
            ? [piece.text]
            : tokenizer.pre_tokenizer(piece.text, { section_index: sectionIndex })
        for (const token of tokenizer.model!(words)) {
          const id = this.byContent.get(token)?.id ?? tokenizer.token_to_id(token) ?? tokenizer.model!.unk_token_id
          if (id !== undefined) ids.push(id)
        }
      }
    })
    return ids
  }
}

/** Added tokens by their characters, longest first where several start alike. */
class TokenTrie {
  private readonly root: TrieNode = { children: new Map(), token: undefined }
  /** The first UTF-16 unit of every token: a position starting with another starts none. */
  private readonly firstUnits = new Set<number>()

  constructor(tokens: ReadonlyArray<AddedToken>) {
    for (const token of tokens) {
      let node = this.root
      for (const character of token.content) {
        let child = node.children.get(character)
        if (child === undefined) {
          child = { children: new Map(), token: undefined }
          node.children.set(character, child)
        }
        node = child
      }
      if (token.content.length === 0) continue
      node.token = token
      this.firstUnits.add(token.content.charCodeAt(0))
    }
  }

  get empty(): boolean {
    return this.root.children.size === 0
  }

  /** The longest token at `at` that `allowed` lets match there. */
  longestAt(text: string, at: number, allowed: (token: AddedToken, end: number) => boolean): AddedToken | undefined {
    if (!this.firstUnits.has(text.charCodeAt(at))) return undefined
    let node: TrieNode | undefined = this.root
    let found: AddedToken | undefined
    for (let end = at; node !== undefined && end < text.length; ) {
      const code = text.codePointAt(end)!
      const character = String.fromCodePoint(code)
      node = node.children.get(character)
      end += character.length
      if (node?.token !== undefined && allowed(node.token, end)) found = node.token
    }
    return found
  }
}

interface TrieNode {
  readonly children: Map<string, TrieNode>
  token: AddedToken | undefined
}

/**
 * `text` in pieces at the added tokens of `trie` (leftmost, longest first), a special one nowhere
 * within a literal; a token's lstrip and rstrip trim the pieces beside it, as tokenizers.js does.
 */
const split = (trie: TokenTrie, text: string, literals: ReadonlyArray<number>): Array<Section> => {
  const sections: Array<{ text: string; token: AddedToken | undefined; literal: boolean }> = []
  if (trie.empty) return [{ text, token: undefined, literal: literals.length > 0 }]
  /** The first literal that ends after the current position, and after the current gap's start. */
  let literal = 0
  let gapLiteral = 0
  let start = 0
  let at = 0
  const overlapsLiteral = (from: number, to: number, first: number) => {
    for (let i = first; i < literals.length; i += 2) {
      if (literals[i]! >= to) return false
      if (literals[i + 1]! > from) return true
    }
    return false
  }
  const endGap = () => {
    if (at > start)
      sections.push({ text: text.slice(start, at), token: undefined, literal: overlapsLiteral(start, at, gapLiteral) })
  }
  while (at < text.length) {
    while (literal < literals.length && literals[literal + 1]! <= at) literal += 2
    const token = trie.longestAt(text, at, (candidate, end) => !candidate.special || !overlapsLiteral(at, end, literal))
    if (token === undefined) {
      at += text.codePointAt(at)! > 0xffff ? 2 : 1
      continue
    }
    endGap()
    sections.push({ text: token.content, token, literal: false })
    at += token.content.length
    start = at
    gapLiteral = literal
  }
  endGap()
  sections.forEach((section, i) => {
    const token = section.token
    if (token === undefined) return
    const before = sections[i - 1]
    if (token.lstrip && before !== undefined && before.token === undefined) before.text = before.text.trimEnd()
    const after = sections[i + 1]
    if (token.rstrip && after !== undefined && after.token === undefined) after.text = after.text.trimStart()
  })
  return sections
}
