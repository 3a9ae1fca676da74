/** The schema thread (`SchemaThread.ts`): reads apps' schemas and writes their documents, one job at a time. */
import { parentPort } from "node:worker_threads"
import { readAppSchemas } from "../app-runtime/driver/AppSchemas.js"
import { appDocument, platformDocument } from "./gateway/OpenApi.js"
import {
  appSchemasOf,
  cleanedSchemasOf,
  type DescribedAppText,
  type SchemaJob,
  type SchemaReply,
  type SchemasRead,
  type UndescribedApp
} from "./SchemaThread.js"

const described = (app: DescribedAppText) => ({ ...app, schemas: appSchemasOf(app.schemas) })
const describedOrNot = (app: DescribedAppText | UndescribedApp) => ("schemas" in app ? described(app) : app)

const answer = (job: SchemaJob): string | SchemasRead => {
  switch (job.kind) {
    case "read": {
      const read = readAppSchemas(job.wire)
      return typeof read === "string" ? { refused: read } : { schemas: cleanedSchemasOf(read) }
    }
    case "appDocument":
      return JSON.stringify(appDocument(described(job.app)))
    case "platformDocument":
      return JSON.stringify(platformDocument(job.apps.map(describedOrNot), job.auth))
  }
}

parentPort!.on("message", (job: SchemaJob) => {
  let reply: SchemaReply
  try {
    reply = { id: job.id, ok: true, value: answer(job) }
  } catch (error) {
    reply = { id: job.id, ok: false, message: error instanceof Error ? error.message : String(error) }
  }
  parentPort!.postMessage(reply)
})
