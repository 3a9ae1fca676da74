import * as Schema from "effect/Schema"

/**
 * The grammar of JSON values a structured-output request compiles to (JsonGrammar.ts) and the
 * byte-level machine walks (JsonMachine.ts): its nodes, an object's layout of its properties, and
 * the request forms it is compiled from.
 */

export type ResponseFormat =
  | { readonly type: "json_object" }
  | {
      readonly type: "json_schema"
      readonly json_schema: {
        readonly name?: string | undefined
        readonly schema?: unknown
        readonly strict?: boolean | null | undefined
      }
    }

/** A schema (or part of one) that cannot be held to; the router answers 400 with its message. */
export class UnsupportedSchema extends Schema.TaggedError<UnsupportedSchema>()("UnsupportedSchema", {
  /** The keyword at fault, e.g. `pattern` or `$ref`. */
  keyword: Schema.String,
  /** A JSON pointer into the schema, `#` for its root. */
  path: Schema.String,
  reason: Schema.String
}) {
  override get message() {
    return `${this.reason} at ${this.path}`
  }
}

/** A complete JSON value written as one sequence of bytes: the node admits exactly these. */
export interface LiteralTrie {
  readonly id: number
  readonly children: ReadonlyMap<number, LiteralTrie>
  /** A literal ends here. */
  readonly terminal: boolean
  /** Bytes from here to the nearest end of a literal, and the first of them (-1 at an end). */
  readonly minRemaining: number
  readonly minNext: number
}

export interface Property {
  readonly name: string
  /** The key as written: `"name"`, quotes included, as UTF-8. */
  readonly key: Uint8Array
  readonly value: GrammarNode
  readonly required: boolean
}

/**
 * Bytes still to write in an object with declared properties, by the index of the next property
 * that may be written (all earlier ones written or left out). The keys that may come next at an
 * index are those from it up to the first required one (see `keyCandidates`).
 */
export interface ObjectLayout {
  /** The first required property from this index on (the count of properties when none is left). */
  readonly nextRequired: ReadonlyArray<number>
  /** Of the keys that may come next, the one whose key, value and tail are the fewest bytes (-1 when none may). */
  readonly cheapest: ReadonlyArray<number>
  /** After a value, with properties from this index left: `}` or `,` and the rest. */
  readonly tail: ReadonlyArray<number>
  /** Where a key starts (after `,` or `{`): the cheapest candidate's key, `:`, value, and the tail. */
  readonly nextKey: ReadonlyArray<number>
  /** Right after `{`. */
  readonly open: number
}

/** The properties whose key may come next at `index` (all before it written or left out). */
export const keyCandidates = (layout: ObjectLayout, index: number): Array<number> => {
  const count = layout.nextRequired.length - 1
  const end = Math.min(layout.nextRequired[index]! + 1, count)
  const candidates: Array<number> = []
  for (let j = index; j < end; j++) candidates.push(j)
  return candidates
}

/** No property is left to write from `index` on but optional ones: the object may close. */
export const mayCloseAt = (layout: ObjectLayout, index: number): boolean =>
  layout.nextRequired[index] === layout.nextRequired.length - 1

export type GrammarNode =
  | {
      readonly kind: "object"
      readonly id: number
      readonly properties: ReadonlyArray<Property>
      /** Defined for an object of any keys, whose values are this node. */
      readonly extra: GrammarNode | undefined
      readonly layout: ObjectLayout
      readonly minLength: number
    }
  | {
      readonly kind: "array"
      readonly id: number
      readonly items: GrammarNode
      readonly minItems: number
      readonly maxItems: number
      readonly minLength: number
    }
  | { readonly kind: "string"; readonly id: number; readonly minLength: number }
  | { readonly kind: "number"; readonly id: number; readonly integer: boolean; readonly minLength: number }
  | { readonly kind: "literal"; readonly id: number; readonly trie: LiteralTrie; readonly minLength: number }
  | {
      readonly kind: "union"
      readonly id: number
      readonly options: ReadonlyArray<GrammarNode>
      readonly minLength: number
    }

export interface Grammar {
  /** Equal for equal requests: masks computed for one serve the other. */
  readonly key: string
  readonly root: GrammarNode
}

export const numberLimits = { integerDigits: 16, fractionDigits: 8, exponentDigits: 2 } as const
