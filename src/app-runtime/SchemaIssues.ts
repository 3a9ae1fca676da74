import * as ParseResult from "effect/ParseResult"
import * as Schema from "effect/Schema"

/** One field a value got wrong: where, and what. */
export const SchemaIssue = Schema.Struct({
  path: Schema.Array(Schema.Union(Schema.String, Schema.Number)),
  message: Schema.String
})
export type SchemaIssue = typeof SchemaIssue.Type

/** One field's problem, as a client reads it: where (keys and indices) and what. */
export interface ReadableIssue {
  readonly path: ReadonlyArray<string | number>
  readonly message: string
}

const key = (part: PropertyKey): string | number => (typeof part === "symbol" ? String(part) : part)

/** "Expected undefined" and the like: the absent side of an optional field, which a present value never meant. */
const absentAlternative = /^Expected (?:undefined|null|void|never)(?:,|$)/

/**
 * The problems of a value a schema refused, one per field: Effect reports a field of an optional
 * or a union once per alternative (`Expected number, actual "x"; Expected undefined, actual "x"`);
 * here the absent alternatives go, the others merge into one line (`expected number or string,
 * got "x"`), and an unknown field says so in words.
 */
export const readableIssues = (error: ParseResult.ParseError): Array<ReadableIssue> => {
  const byPath = new Map<string, { path: Array<string | number>; messages: Array<string> }>()
  for (const issue of ParseResult.ArrayFormatter.formatErrorSync(error)) {
    const path = issue.path.map(key)
    const id = JSON.stringify(path)
    const entry = byPath.get(id) ?? { path, messages: [] }
    if (!entry.messages.includes(issue.message)) entry.messages.push(issue.message)
    byPath.set(id, entry)
  }
  const groups = [...byPath.values()]
  // A field whose only complaint is its absent alternative has its real problem deeper (an element).
  const deeper = (path: ReadonlyArray<string | number>) =>
    groups.some((other) => other.path.length > path.length && path.every((part, index) => other.path[index] === part))
  return groups
    .filter(({ path, messages }) => !(messages.every((message) => absentAlternative.test(message)) && deeper(path)))
    .map(({ path, messages }) => ({ path, message: merged(messages) }))
}

const merged = (messages: ReadonlyArray<string>): string => {
  const present = messages.filter((message) => !absentAlternative.test(message))
  const kept = present.length > 0 ? present : messages
  const expectations = kept.map((message) => /^Expected (.+), actual (.+)$/s.exec(message))
  if (expectations.every((match) => match !== null)) {
    const actual = expectations[0]![2]!
    if (expectations.every((match) => match![2] === actual)) {
      return `expected ${[...new Set(expectations.map((match) => match![1]!))].join(" or ")}, got ${actual}`
    }
  }
  return kept
    .map((message) => {
      const unexpected = /^is unexpected, expected: (.+)$/s.exec(message)
      if (unexpected !== null) return `is not a field here (the fields are ${unexpected[1]!.split(" | ").join(", ")})`
      if (message === "is missing") return "is required"
      return message
    })
    .join("; ")
}

/** One line per field: `path: problem` (`(body)` for the value itself). */
export const issueLines = (issues: ReadonlyArray<ReadableIssue>): Array<string> =>
  issues.map(({ path, message }) => `${path.length > 0 ? path.join(".") : "(body)"}: ${message}`)
