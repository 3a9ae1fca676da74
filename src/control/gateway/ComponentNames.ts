/**
 * The names apps' named schemas take in an OpenAPI document's one `components/schemas`, beside the
 * platform's own. Linear in the size of the schemas, however their names collide or their
 * references chain: an app's schemas reach here from its process, which runs the app's code.
 */
import { type AppSchemas, cleanSchema, defsRefPrefix, type JsonSchema } from "../../app-runtime/driver/AppSchemas.js"
import { UniqueNames } from "../../app-runtime/driver/UniqueNames.js"

/** An app as the naming sees it: its id and its named schemas. */
export interface NamedApp {
  readonly id: string
  readonly schemas: Pick<AppSchemas, "defs">
}

/** The `$defs` names a schema refers to. */
const refsOf = (schema: JsonSchema): Array<string> => {
  const found: Array<string> = []
  cleanSchema(schema, (target) => {
    if (target.startsWith(defsRefPrefix)) found.push(target.slice(defsRefPrefix.length))
    return target
  })
  return found
}

/**
 * The names kept as they are: each given the same schema by every app that has it (and by the
 * platform, when it has it too), and referring only to names kept alike. A name one app gives
 * another schema is not kept, nor, in turn, any name whose schema refers to it: found by walking
 * the references backwards from each name not kept, once each.
 */
const sharedNames = (platform: ReadonlyMap<string, JsonSchema>, apps: ReadonlyArray<NamedApp>): Set<string> => {
  /** Each name's schema as JSON, or null once two differ. */
  const texts = new Map<string, string | null>([...platform].map(([name, schema]) => [name, JSON.stringify(schema)]))
  for (const app of apps) {
    for (const [name, schema] of app.schemas.defs) {
      const text = JSON.stringify(schema)
      const seen = texts.get(name)
      texts.set(name, seen === undefined || seen === text ? text : null)
    }
  }
  const shared = new Set([...texts].flatMap(([name, text]) => (text === null ? [] : [name])))
  /** Who refers to each name, among the names kept so far. */
  const referrers = new Map<string, Array<string>>()
  const dropped: Array<string> = []
  for (const app of apps) {
    for (const [name, schema] of app.schemas.defs) {
      if (!shared.has(name)) continue
      for (const target of refsOf(schema)) {
        if (!shared.has(target)) {
          dropped.push(name)
          break
        }
        const others = referrers.get(target)
        if (others === undefined) referrers.set(target, [name])
        else others.push(name)
      }
    }
  }
  for (const name of texts.keys()) if (!shared.has(name)) dropped.push(name)
  while (dropped.length > 0) {
    const name = dropped.pop()!
    shared.delete(name)
    for (const referrer of referrers.get(name) ?? []) if (shared.has(referrer)) dropped.push(referrer)
    referrers.delete(name)
  }
  return shared
}

/**
 * The name each app's named schema takes in the document, by app id and by the name in its
 * `$defs`. A name every app that has it gives the same schema (and whose references are shared
 * alike) is kept once, as the OpenAI chat request of every chat app is, or a platform's schema the
 * same as an app's (`Int`); another is named for its app (`Request.hello`), with a suffix should
 * that name be taken (`Request.hello_2`).
 */
export const componentNames = (
  platform: ReadonlyMap<string, JsonSchema>,
  apps: ReadonlyArray<NamedApp>
): Map<string, Map<string, string>> => {
  const shared = sharedNames(platform, apps)
  const unique = new UniqueNames([...platform.keys(), ...shared])
  const names = new Map<string, Map<string, string>>()
  for (const app of apps) {
    const own = new Map<string, string>()
    for (const name of app.schemas.defs.keys())
      own.set(name, shared.has(name) ? name : unique.take(`${name}.${app.id}`))
    names.set(app.id, own)
  }
  return names
}
