/**
 * How the OpenAPI documents see the apps: described with their schemas, or named only; and who must
 * show what to the platform's routes. Shared by the documents (`gateway/OpenApi.ts`), which take an
 * app's schemas as objects, and the schema thread (`SchemaThread.ts`), to which they travel as text.
 */

/** An app whose schemas a document shows, with its schemas as `Schemas`. */
export interface AppDescription<Schemas> {
  readonly id: string
  readonly description: string | undefined
  readonly example: unknown
  readonly schemas: Schemas
  /** Its invoke routes want an API key (the platform's, or one of its own). */
  readonly needsApiKey: boolean
  /** When its current version was registered: its document's version. */
  readonly registeredAt: string
}

/** An app the platform's document names without its schemas: not ready, or its API keys keep them from this reader. */
export interface UndescribedApp {
  readonly id: string
  readonly why: string
  readonly needsApiKey: boolean
}

/** Who must show what to the platform's routes. */
export interface PlatformAuth {
  /** The admin routes want the admin token (all but `--insecure-no-auth`). */
  readonly adminToken: boolean
  /** `/metrics` wants the metrics token or the admin token (unless `--public-metrics`). */
  readonly metricsToken: boolean
}
