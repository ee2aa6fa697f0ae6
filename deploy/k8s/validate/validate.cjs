#!/usr/bin/env node
// Schema check of rendered Kubernetes objects, offline, with the OpenAPI
// schemas that the npm packages kubernetes-models (Kubernetes API) and
// @kubernetes-models/prometheus-operator (monitoring.coreos.com CRDs) ship as
// compiled validators (versions pinned in package-lock.json).
//
//   node validate.cjs OBJECTS.json...   (each file: a JSON array of objects)
//
// Those validators check types, formats, enums and required fields, but the
// schemas allow unknown fields, so a misspelt key ("readinesProbe") would
// pass. This script therefore also finds keys the schema does not know: it
// validates a Proxy of each object that records which keys the validator
// looks up. A validator for an object schema with properties looks up every
// property the schema names, so a key of the object that was never looked up
// is not in the schema. An object whose keys the validator enumerates (a map
// such as labels) accepts any key. An object the validator neither looked
// into nor enumerated has no property list in the schema (free-form, e.g.
// x-kubernetes-preserve-unknown-fields): its keys are not checked, and the
// report names each such path so the coverage is plain. One blind spot of
// the compiled validators: a field named "description" (PriorityClass) is
// never looked up (the generator drops it, like the schema keyword of that
// name), so such a key is reported as not checked instead of unknown.
//
// Exit status 0 when every object is known and valid, 1 otherwise.
"use strict";

const fs = require("fs");

// The model module of an apiVersion and kind, or null for an unknown group.
function modelModule(apiVersion, kind) {
  const slash = apiVersion.indexOf("/");
  const group = slash < 0 ? "" : apiVersion.slice(0, slash);
  const version = slash < 0 ? apiVersion : apiVersion.slice(slash + 1);
  if (group === "monitoring.coreos.com") {
    return `@kubernetes-models/prometheus-operator/${group}/${version}/${kind}`;
  }
  return group === "" ? `kubernetes-models/${version}/${kind}`
                      : `kubernetes-models/${group}/${version}/${kind}`;
}

// A deep Proxy of value; every object node records the keys read and
// whether its keys were enumerated.
function track(value, path, nodes) {
  if (value === null || typeof value !== "object") return value;
  const node = { path, value, read: new Set(), enumerated: false };
  nodes.push(node);
  const children = Array.isArray(value) ? [] : {};
  for (const key of Object.keys(value)) {
    children[key] = track(value[key], `${path}/${key}`, nodes);
  }
  return new Proxy(value, {
    get(target, key) {
      if (typeof key === "string") node.read.add(key);
      return Object.prototype.hasOwnProperty.call(children, key) ? children[key] : target[key];
    },
    has(target, key) {
      if (typeof key === "string") node.read.add(key);
      return key in target;
    },
    ownKeys(target) {
      node.enumerated = true;
      return Reflect.ownKeys(target);
    },
  });
}

// Fields that the compiled validators never look up although the schema
// has them (see the header).
const NEVER_LOOKED_UP = new Set(["description"]);

// Problems with one object, and the paths whose keys could not be checked.
function checkObject(obj) {
  const where = `${obj.kind}/${(obj.metadata || {}).name}`;
  let Model;
  try {
    const mod = require(modelModule(obj.apiVersion, obj.kind));
    Model = mod[obj.kind];
  } catch (e) {
    return { where, problems: [`no schema for ${obj.apiVersion} ${obj.kind}`], unchecked: [] };
  }
  const nodes = [];
  const proxy = track(obj, "", nodes);
  const problems = [];
  try {
    Model.prototype.validate.call(proxy);
  } catch (e) {
    for (const err of e.errors || [{ instancePath: "", message: e.message }]) {
      problems.push(`${err.instancePath || "/"}: ${err.message || err.keyword}` +
                    (err.params ? ` ${JSON.stringify(err.params)}` : ""));
    }
  }
  const unchecked = [];
  // Paths reported already (unknown or not checked): their subtrees are not
  // reported again. nodes is in pre-order, parents first.
  const reported = [];
  const under = (path) => reported.some((r) => path === r || path.startsWith(`${r}/`));
  for (const node of nodes) {
    if (Array.isArray(node.value) || node.enumerated || under(node.path)) continue;
    const keys = Object.keys(node.value);
    if (keys.length === 0) continue;
    if (node.read.size === 0) {
      unchecked.push(node.path || "/");
      reported.push(node.path);
      continue;
    }
    for (const key of keys) {
      if (node.read.has(key)) continue;
      reported.push(`${node.path}/${key}`);
      if (NEVER_LOOKED_UP.has(key)) {
        unchecked.push(`${node.path}/${key}`);
      } else {
        problems.push(`${node.path}/${key}: not a field of the schema`);
      }
    }
  }
  return { where, problems, unchecked };
}

function main(files) {
  if (files.length === 0) {
    console.error("usage: validate.cjs OBJECTS.json...");
    return 2;
  }
  let failed = 0;
  let total = 0;
  for (const file of files) {
    for (const obj of JSON.parse(fs.readFileSync(file, "utf8"))) {
      total++;
      const { where, problems, unchecked } = checkObject(obj);
      const note = unchecked.length ? ` (not checked: ${unchecked.join(", ")})` : "";
      if (problems.length) {
        failed++;
        console.log(`FAIL ${file}: ${where}${note}`);
        for (const p of problems) console.log(`  ${p}`);
      } else {
        console.log(`ok   ${file}: ${where}${note}`);
      }
    }
  }
  console.log(`validate.cjs: ${total - failed} of ${total} objects valid`);
  return failed ? 1 : 0;
}

process.exitCode = main(process.argv.slice(2));
