import java.sql.*;
import java.util.*;

/**
 * What pgjdbc's DatabaseMetaData answers (the calls Metabase and DBeaver make), as tab-separated
 * lines, so tests/test_reflection.py can compare the source Postgres with `skipprd serve`.
 *
 *   java -cp .:postgresql.jar JdbcMetadataProbe URL USER PASSWORD SCHEMA=REL[,REL...] ...
 *
 * Every line is `call TAB schema TAB relation TAB COLUMN=value TAB ...` with every column of one
 * row of the call's ResultSet, in the ResultSet's order (NULL as \N; tab, newline and backslash
 * escaped as \t, \n, \\). A call that fails prints one line whose last field is
 * `ERROR=<SQLSTATE> <message>`; the next call goes on.
 *
 * Calls: getSchemas(); per schema getTables(null, schema, "%", null) and
 * getTablePrivileges(null, schema, "%"); per relation getColumns, getPrimaryKeys,
 * getIndexInfo(unique = false and true, approximate = true), getImportedKeys, getExportedKeys
 * and getBestRowIdentifier(bestRowSession, nullable = true).
 */
public class JdbcMetadataProbe {
    interface Call {
        ResultSet run() throws SQLException;
    }

    static String esc(String s) {
        if (s == null) return "\\N";
        StringBuilder b = new StringBuilder();
        for (char c : s.toCharArray()) {
            switch (c) {
                case '\\': b.append("\\\\"); break;
                case '\t': b.append("\\t"); break;
                case '\n': b.append("\\n"); break;
                case '\r': b.append("\\r"); break;
                default: b.append(c);
            }
        }
        return b.toString();
    }

    static void dump(String call, String schema, String rel, Call c) {
        String head = esc(call) + "\t" + esc(schema) + "\t" + esc(rel);
        try (ResultSet rs = c.run()) {
            ResultSetMetaData m = rs.getMetaData();
            while (rs.next()) {
                StringBuilder line = new StringBuilder(head);
                for (int i = 1; i <= m.getColumnCount(); i++) {
                    line.append('\t').append(esc(m.getColumnLabel(i))).append('=').append(esc(rs.getString(i)));
                }
                System.out.println(line);
            }
        } catch (SQLException e) {
            String msg = String.valueOf(e.getMessage()).split("\n")[0];
            System.out.println(head + "\tERROR=" + esc(e.getSQLState() + " " + msg));
        }
    }

    public static void main(String[] a) throws Exception {
        String url = a[0], user = a[1], password = a[2];
        Properties p = new Properties();
        p.setProperty("user", user);
        if (!password.isEmpty()) p.setProperty("password", password);
        try (Connection conn = DriverManager.getConnection(url, p)) {
            DatabaseMetaData md = conn.getMetaData();
            dump("getSchemas", null, null, md::getSchemas);
            for (int g = 3; g < a.length; g++) {
                String[] parts = a[g].split("=", 2);
                String schema = parts[0];
                dump("getTables", schema, null, () -> md.getTables(null, schema, "%", null));
                dump("getTablePrivileges", schema, null, () -> md.getTablePrivileges(null, schema, "%"));
                for (String rel : parts[1].split(",")) {
                    if (rel.isEmpty()) continue;
                    dump("getColumns", schema, rel, () -> md.getColumns(null, schema, rel, "%"));
                    dump("getPrimaryKeys", schema, rel, () -> md.getPrimaryKeys(null, schema, rel));
                    dump("getIndexInfo(unique=false)", schema, rel, () -> md.getIndexInfo(null, schema, rel, false, true));
                    dump("getIndexInfo(unique=true)", schema, rel, () -> md.getIndexInfo(null, schema, rel, true, true));
                    dump("getImportedKeys", schema, rel, () -> md.getImportedKeys(null, schema, rel));
                    dump("getExportedKeys", schema, rel, () -> md.getExportedKeys(null, schema, rel));
                    dump("getBestRowIdentifier", schema, rel,
                         () -> md.getBestRowIdentifier(null, schema, rel, DatabaseMetaData.bestRowSession, true));
                }
            }
        }
    }
}
