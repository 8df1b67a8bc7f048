package io.github.deltamirror.kernelreader;

import com.fasterxml.jackson.databind.ObjectMapper;
import io.delta.kernel.defaults.engine.DefaultEngine;
import io.delta.kernel.exceptions.KernelException;
import io.delta.kernel.exceptions.UnsupportedProtocolVersionException;
import io.delta.kernel.exceptions.UnsupportedTableFeatureException;
import java.io.PrintStream;
import java.util.LinkedHashMap;
import java.util.Map;
import java.util.regex.Pattern;
import org.apache.hadoop.conf.Configuration;

/**
 * {@code java -jar delta-mirror-kernel-reader.jar <table-uri> [--version N] [--no-rows]}: one JSON
 * object on stdout with the table as delta-kernel-java reads it (see {@link TableReader}), or on
 * failure one JSON line {@code {"error": "<class>: <message>", "kind": "unsupported"|"error",
 * "phase": "snapshot"|"scan"|"data"}} (loading the log, listing the files, reading the rows).
 *
 * <p>{@code unsupported} marks the kernel's own refusals (a reader feature or protocol version it
 * does not implement), so the caller can tell a reader limitation from a broken table. Exit codes:
 * 0 read, 2 error, 3 unsupported, 64 bad arguments.
 *
 * <p>{@code --versions LO-HI} (or a comma list) reads several versions in one JVM: one JSON line
 * per version, in order, a failed one as its error object with {@code "version"} added; exit 0.
 */
public final class KernelReader {
  static final int OK = 0;
  static final int ERROR = 2;
  static final int UNSUPPORTED = 3;
  static final int USAGE = 64;

  private static final ObjectMapper JSON = new ObjectMapper();
  private static final Pattern UNSUPPORTED_TEXT =
      Pattern.compile(
          "unsupported|not supported|not implemented|does(n't| not) support", Pattern.CASE_INSENSITIVE);
  private static final String USAGE_TEXT =
      "usage: java -jar delta-mirror-kernel-reader.jar <table-uri> [--version N] [--no-rows]";

  private KernelReader() {}

  public static void main(String[] args) {
    System.setProperty("org.slf4j.simpleLogger.defaultLogLevel", "warn");
    System.setProperty("org.slf4j.simpleLogger.logFile", "System.err");
    System.exit(run(args, System.out));
  }

  /** Everything but {@code System.exit}, for the tests. */
  static int run(String[] args, PrintStream out) {
    String table = null;
    Long version = null;
    java.util.List<Long> versions = null;
    boolean readRows = true;
    try {
      for (int i = 0; i < args.length; i++) {
        switch (args[i]) {
          case "--version" -> {
            if (i + 1 >= args.length) {
              throw new IllegalArgumentException("--version needs a number");
            }
            version = Long.parseLong(args[++i]);
            if (version < 0) {
              throw new IllegalArgumentException("--version must be >= 0, not " + version);
            }
          }
          case "--versions" -> {
            if (i + 1 >= args.length) {
              throw new IllegalArgumentException("--versions needs LO-HI or a comma list");
            }
            versions = versionList(args[++i]);
          }
          case "--no-rows" -> readRows = false;
          default -> {
            if (args[i].startsWith("--") || table != null) {
              throw new IllegalArgumentException("unexpected argument " + args[i]);
            }
            table = args[i];
          }
        }
      }
      if (table == null) {
        throw new IllegalArgumentException("a table URI or path is required");
      }
      if (version != null && versions != null) {
        throw new IllegalArgumentException("give --version or --versions, not both");
      }
    } catch (IllegalArgumentException e) {
      print(out, error(e.getMessage() + " (" + USAGE_TEXT + ")", "error"));
      return USAGE;
    }
    TableReader reader;
    try {
      reader = new TableReader(DefaultEngine.create(hadoopConf()));
    } catch (Throwable t) {
      print(out, failure(t));
      return ERROR;
    }
    if (versions == null) {
      Map<String, Object> result = readOne(reader, table, version, readRows);
      print(out, result);
      return !result.containsKey("error")
          ? OK
          : "unsupported".equals(result.get("kind")) ? UNSUPPORTED : ERROR;
    }
    for (Long v : versions) {
      Map<String, Object> result = readOne(reader, table, v, readRows);
      if (result.containsKey("error")) {
        result.put("version", v);
      }
      print(out, result);
    }
    return OK;
  }

  /**
   * Local files through Hadoop's raw file system: the checksummed default verifies Hadoop's own
   * {@code .x.crc} sidecars, which are no part of Delta, and refuses a commit whose sidecar is
   * stale (a log copied or edited by a non-Hadoop tool) though every other reader reads it.
   */
  static Configuration hadoopConf() {
    Configuration conf = new Configuration();
    conf.set("fs.file.impl", "org.apache.hadoop.fs.RawLocalFileSystem");
    conf.setBoolean("fs.file.impl.disable.cache", true);
    return conf;
  }

  private static Map<String, Object> readOne(
      TableReader reader, String table, Long version, boolean readRows) {
    try {
      return reader.read(table, version, readRows);
    } catch (Throwable t) { // the caller gets one line for anything, even an Error
      Map<String, Object> out = failure(t);
      out.put("phase", reader.phase());
      return out;
    }
  }

  private static Map<String, Object> failure(Throwable t) {
    return error(describe(t), isUnsupported(t) ? "unsupported" : "error");
  }

  /** {@code "3-7"} or {@code "1,4,9"}: the versions to read, in that order. */
  static java.util.List<Long> versionList(String text) {
    java.util.List<Long> out = new java.util.ArrayList<>();
    try {
      for (String part : text.split(",")) {
        String[] range = part.trim().split("-", 2);
        long lo = Long.parseLong(range[0].trim());
        long hi = range.length == 2 ? Long.parseLong(range[1].trim()) : lo;
        if (lo < 0 || hi < lo) {
          throw new IllegalArgumentException("bad version range " + part.trim());
        }
        for (long v = lo; v <= hi; v++) {
          out.add(v);
        }
      }
    } catch (NumberFormatException e) {
      throw new IllegalArgumentException("--versions takes LO-HI or a comma list, not " + text);
    }
    return out;
  }

  /** True when the kernel refused a feature it does not implement (anywhere in the cause chain). */
  static boolean isUnsupported(Throwable t) {
    for (Throwable c = t; c != null; c = c.getCause() == c ? null : c.getCause()) {
      if (c instanceof UnsupportedTableFeatureException
          || c instanceof UnsupportedProtocolVersionException
          || c instanceof UnsupportedOperationException) {
        return true;
      }
      if (c instanceof KernelException
          && c.getMessage() != null
          && UNSUPPORTED_TEXT.matcher(c.getMessage()).find()) {
        return true;
      }
    }
    return false;
  }

  /** "<class>: <message>" on one line, the innermost cause's text appended when it differs. */
  static String describe(Throwable t) {
    String text = t.getClass().getName() + ": " + t.getMessage();
    Throwable root = t;
    while (root.getCause() != null && root.getCause() != root) {
      root = root.getCause();
    }
    if (root != t && root.getMessage() != null && !text.contains(root.getMessage())) {
      text += " (caused by " + root.getClass().getName() + ": " + root.getMessage() + ")";
    }
    return text.replaceAll("\\s*\\R\\s*", " ").trim();
  }

  private static Map<String, Object> error(String message, String kind) {
    Map<String, Object> out = new LinkedHashMap<>();
    out.put("error", message);
    out.put("kind", kind);
    return out;
  }

  private static void print(PrintStream out, Map<String, Object> value) {
    try {
      out.println(JSON.writeValueAsString(value));
    } catch (Exception e) {
      out.println("{\"error\": \"cannot write JSON\", \"kind\": \"error\"}");
    }
    out.flush();
  }
}
